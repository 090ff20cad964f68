//! Memory migration: the passes of a live checkpoint
//! ([`live_snapshot`](super::live::live_snapshot)) streamed over TCP from a
//! [`Sender`] (`pagewise snapshot --live --to HOST:PORT`) to a [`Receiver`]
//! (`pagewise receive --listen ADDR --out DIR`), which keeps a copy of the
//! process's memory and saves it, once complete, as an ordinary snapshot in
//! its [`DiskStore`].
//!
//! # Protocol, version 2
//!
//! All integers are little-endian. The sender connects and speaks first.
//! A reader refuses any version but its own (version 1 had no nonces and
//! no authentication).
//!
//! ```text
//! sender                                             receiver
//!   | -- hello: "PGWM", u32 version, u32 flags, ------> |  flags bit 0: may send LZ4,
//!   |           16-byte nonce                           |  bit 1: authenticated
//!   | <- hello: "PGWM", u32 version, u32 status, ------ |  status 0, or an errno and
//!   |           u64 snapshots in the store,             |  the receiver closes
//!   |           16-byte nonce                           |
//!   | -- 'B' begin ------------------------------------> |  a copy: the last one saved
//!   |                                                   |  on this connection, or empty
//!   | -- 'R' regions: u32 n, n x (u64 start, u64 len) -> |  the copy's regions now
//!   | -- 'P' pages (below) ----------------------------> |  into the copy
//!   | -- 'E' end of pass: u32 pass -------------------> |
//!   |    ... more 'R', 'P', 'E' ...                     |
//!   | -- 'D' done: no more pages ----------------------> |
//!   | <- 'K' u64 pages held ---------------------------- |  the copy is complete
//!   | -- 'F' finish: i64 pid, u32 len, label ----------> |  saved as one snapshot
//!   | <- 'A' u64 id, pages, pages_new, zero_pages, ----- |
//!   |        pack_bytes, index_bytes                    |
//!   |    ... another 'B' ... 'A', or ------------------ |
//!   | -- 'Q' quit (or close) --------------------------> |
//! ```
//!
//! A pages message is a 24-byte header — `u8` 'P', `u8` encoding (0 raw,
//! 1 LZ4 block, 2 zero pages: no payload), 2 zero bytes, `u32` page count
//! (1 to [`MAX_CHUNK_PAGES`]), `u64` address of the first page, `u32`
//! payload length, 4 zero bytes — then one `u64` xxh3-64 digest per page
//! ([`page_hash`]) of its uncompressed contents, then the payload. The
//! pages lie inside one region of the last `'R'`.
//!
//! The receiver's states:
//!
//! - *greeting* (from the start): the hello, answered, moves to *idle*; a
//!   hello of another magic or version is answered with status `EPROTO` and
//!   the connection ends.
//! - *idle*: `'B'` starts a copy (*copying*) from the last copy saved on
//!   this connection (a later checkpoint sends only what changed), or from
//!   nothing; `'Q'` or the end of the stream ends the connection cleanly.
//! - *copying*: `'R'` reshapes the copy (regions equal to one it holds keep
//!   their contents, new ones start as zeros); `'P'` writes pages into it
//!   after checking each page's digest; `'E'` counts a pass; `'D'` is
//!   answered with `'K'` (*complete*).
//! - *complete*: `'F'` saves the copy into the store, answers `'A'` and
//!   goes back to *idle*.
//!
//! Anything else — an unknown message, a message that does not fit the
//! state, a page outside the regions, a digest that does not match, a
//! length past the limits — is answered with `'X'` (`u32` length, the reason
//! in UTF-8) and ends the connection. A connection that ends or breaks in
//! *copying* or *complete* discards the copy: the store is left at its last
//! complete snapshot (the store's own save is crash-safe), and the receiver
//! says so.
//!
//! Authentication: a receiver listening beyond loopback needs a shared
//! secret ([`Key`], `--key FILE` at both ends). With one, the sender's
//! hello carries flag bit 1 (a receiver with a key refuses a hello without
//! it, and one without a key a hello with it: status `EACCES`), and every
//! later message in either direction but `'X'` is followed by a 32-byte tag:
//! HMAC-SHA256 under the session key HMAC-SHA256(key, `"pagewise-wire-2"`
//! ‖ sender's nonce ‖ receiver's nonce), over one direction byte (`'S'`
//! from the sender, `'R'` from the receiver), the message's sequence
//! number in its direction (`u64`, from 0) and the message's bytes. A
//! message is acted on only once its tag is checked; a wrong tag is
//! refused. Fresh nonces on both sides make a recorded connection useless
//! to replay. `'X'` is not authenticated: it only ends a connection, which
//! anyone on the path can do anyway.
//!
//! Limits: a receiver holds at most [`Receiver::max_bytes`] per connection
//! (the regions a sender declares, refused beyond), serves connections
//! concurrently (at most [`Receiver::max_connections`]; more are refused
//! with status `EBUSY`), and gives a connection up when it is silent for
//! [`Receiver::idle`] or lasts longer than [`Receiver::max_time`] in all
//! ("timed out").
//!
//! Compression: with [`Compression::Auto`] each chunk is compressed with LZ4
//! and sent compressed only if that saves at least an eighth; after a chunk
//! it did not pay for, only every 16th chunk is tried until one pays again
//! (memory that does not compress costs little time). All-zero chunks are
//! sent as zero pages whatever the setting.

use super::disk::{DiskStore, SaveStats};
use super::live::Destination;
use crate::mech::hash::page_hash;
use crate::{Error, PageRange, Region, Result, PAGE_SIZE};
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::Sha256;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// `PGWM`.
pub const MAGIC: u32 = 0x4d57_4750;
/// Protocol version.
pub const VERSION: u32 = 2;
/// Hello flag: the sender may send LZ4 chunks.
pub const FLAG_LZ4: u32 = 1;
/// Hello flag: every message is authenticated (see the module).
pub const FLAG_AUTH: u32 = 2;
/// Bytes of a hello's nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a message's authentication tag.
pub const TAG_LEN: usize = 32;
/// Bytes of the sender's hello.
pub const HELLO_LEN: usize = 12 + NONCE_LEN;
/// Bytes of the receiver's hello.
pub const REPLY_LEN: usize = 20 + NONCE_LEN;
/// Most pages in one pages message.
pub const MAX_CHUNK_PAGES: u32 = 256;
/// Most regions in one regions message.
pub const MAX_REGIONS: u32 = 1 << 20;
/// Longest label.
pub const MAX_LABEL: u32 = 4096;
/// Longest error text.
const MAX_REASON: u32 = 1 << 16;
/// Encoding: raw pages.
pub const ENC_RAW: u8 = 0;
/// Encoding: one LZ4 block of the pages.
pub const ENC_LZ4: u8 = 1;
/// Encoding: zero pages, no payload.
pub const ENC_ZERO: u8 = 2;
/// Message tags.
const MSG_BEGIN: u8 = b'B';
const MSG_REGIONS: u8 = b'R';
const MSG_PAGES: u8 = b'P';
const MSG_END_PASS: u8 = b'E';
const MSG_DONE: u8 = b'D';
const MSG_COMPLETE: u8 = b'K';
const MSG_FINISH: u8 = b'F';
const MSG_SAVED: u8 = b'A';
const MSG_QUIT: u8 = b'Q';
const MSG_ERROR: u8 = b'X';
/// Silence after which either side gives the connection up.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the sender compresses pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    /// Raw pages (zero pages still sent as such).
    None,
    /// LZ4 where it saves at least an eighth (see the module).
    Auto,
    /// LZ4 for every chunk, even when it does not pay (for measuring).
    Lz4,
}

impl std::str::FromStr for Compression {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "none" => Ok(Compression::None),
            "auto" => Ok(Compression::Auto),
            "lz4" => Ok(Compression::Lz4),
            _ => Err(format!("compression {s:?}: none, auto or lz4")),
        }
    }
}

/// A secret both ends of a migration share (`--key FILE`), authenticating
/// every message (see the module). At least 16 bytes.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

impl Key {
    /// The key of `bytes` (at least 16).
    pub fn from_bytes(bytes: &[u8]) -> Result<Key> {
        if bytes.len() < 16 {
            return Err(Error::Invalid(format!(
                "a key of {} bytes: at least 16 are needed",
                bytes.len()
            )));
        }
        Ok(Key(bytes.to_vec()))
    }

    /// The key in file `path`: its bytes, leading and trailing whitespace
    /// left out (at most 4 KiB read). Refused unless the file is the
    /// caller's own and nobody else may read it (checked on the open file).
    pub fn from_file(path: &std::path::Path) -> Result<Key> {
        use std::os::unix::fs::MetadataExt;
        let f = std::fs::File::open(path)
            .map_err(|e| Error::os(format!("opening the key {}", path.display()), e))?;
        let md = f
            .metadata()
            .map_err(|e| Error::os(format!("reading the key {}", path.display()), e))?;
        if md.uid() != pagewise_sys::process::geteuid() || md.mode() & 0o077 != 0 {
            return Err(Error::NotPermitted(format!(
                "the key {} must be yours and readable by you alone (chmod 600), \
                 not mode {:o} of user {}",
                path.display(),
                md.mode() & 0o7777,
                md.uid()
            )));
        }
        let mut b = Vec::new();
        f.take(4096)
            .read_to_end(&mut b)
            .map_err(|e| Error::os(format!("reading the key {}", path.display()), e))?;
        let t = b.trim_ascii();
        Key::from_bytes(t)
    }
}

type HmacSha256 = Hmac<Sha256>;

/// One connection's authentication (see the module): a running tag for
/// the message being sent and the one being read.
struct Auth {
    session: [u8; 32],
    /// Direction bytes: this side's, the peer's.
    dirs: (u8, u8),
    seq: (u64, u64),
    tx: Option<HmacSha256>,
    rx: Option<HmacSha256>,
}

impl Auth {
    fn new(key: &Key, sender_nonce: &[u8], receiver_nonce: &[u8], sender: bool) -> Auth {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&key.0).expect("any key length");
        m.update(b"pagewise-wire-2");
        m.update(sender_nonce);
        m.update(receiver_nonce);
        let mut session = [0u8; 32];
        session.copy_from_slice(&m.finalize().into_bytes());
        Auth {
            session,
            dirs: if sender { (b'S', b'R') } else { (b'R', b'S') },
            seq: (0, 0),
            tx: None,
            rx: None,
        }
    }

    fn start(&self, dir: u8, seq: u64) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.session).expect("32 bytes");
        m.update(&[dir]);
        m.update(&seq.to_le_bytes());
        m
    }

    fn sent(&mut self, b: &[u8]) {
        if self.tx.is_none() {
            self.tx = Some(self.start(self.dirs.0, self.seq.0));
        }
        self.tx.as_mut().expect("set").update(b);
    }

    /// The tag of the message sent since the last one.
    fn end_sent(&mut self) -> [u8; TAG_LEN] {
        let m = self
            .tx
            .take()
            .unwrap_or_else(|| self.start(self.dirs.0, self.seq.0));
        self.seq.0 += 1;
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&m.finalize().into_bytes());
        t
    }

    fn read(&mut self, b: &[u8]) {
        if self.rx.is_none() {
            self.rx = Some(self.start(self.dirs.1, self.seq.1));
        }
        self.rx.as_mut().expect("set").update(b);
    }

    /// Whether `tag` is that of the message read since the last one.
    fn check_read(&mut self, tag: &[u8]) -> bool {
        let m = self
            .rx
            .take()
            .unwrap_or_else(|| self.start(self.dirs.1, self.seq.1));
        self.seq.1 += 1;
        m.verify_slice(tag).is_ok()
    }
}

/// A fresh nonce.
fn nonce() -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    let got = pagewise_sys::process::getrandom(&mut n).map_err(|e| Error::os("getrandom", e))?;
    if got != NONCE_LEN {
        return Err(Error::Internal("getrandom returned a short nonce".into()));
    }
    Ok(n)
}

/// What a sender put on the wire.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct WireStats {
    /// Pages sent.
    pub pages: u64,
    /// Bytes of those pages.
    pub page_bytes: u64,
    /// Bytes written to the connection in all.
    pub wire_bytes: u64,
    /// Chunks sent raw, LZ4-compressed, as zero pages.
    pub chunks_raw: u64,
    /// Chunks sent LZ4-compressed.
    pub chunks_lz4: u64,
    /// Chunks of zero pages.
    pub chunks_zero: u64,
    /// Time spent compressing, ms.
    pub compress_ms: f64,
    /// Time spent writing to the connection (and waiting for the receiver), ms.
    pub send_ms: f64,
}

fn wire_err(peer: &str, what: impl Into<String>) -> Error {
    Error::Corrupt {
        path: format!("the connection with {peer}"),
        what: what.into(),
    }
}

fn le_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}

/// The sending side: a [`Destination`] for
/// [`live_snapshot`](super::live::live_snapshot) that streams each pass to
/// a receiver.
pub struct Sender {
    peer: String,
    out: BufWriter<TcpStream>,
    input: BufReader<TcpStream>,
    compression: Compression,
    /// Regions of the last `'R'`.
    sent_regions: Vec<Region>,
    /// Inside a snapshot (after `'B'`).
    begun: bool,
    /// `'D'` sent and `'K'` received.
    complete: bool,
    passes: u32,
    /// Chunks left before trying LZ4 again ([`Compression::Auto`]).
    skip_lz4: u32,
    lz4: Vec<u8>,
    stats: WireStats,
    /// Snapshots the receiver's store held at the hello.
    pub receiver_snapshots: u64,
    auth: Option<Auth>,
}

impl Sender {
    /// Connects to a receiver at `addr` and greets it, without a key (a
    /// receiver on loopback).
    pub fn connect(addr: &str, compression: Compression) -> Result<Sender> {
        Self::connect_with(addr, compression, None)
    }

    /// Connects to a receiver at `addr` and greets it; with `key`, every
    /// message is authenticated (see the module).
    pub fn connect_with(addr: &str, compression: Compression, key: Option<&Key>) -> Result<Sender> {
        let addrs: Vec<_> = addr
            .to_socket_addrs()
            .map_err(|e| Error::Invalid(format!("address {addr}: {e}")))?
            .collect();
        let mut last = None;
        for a in &addrs {
            match TcpStream::connect_timeout(a, Duration::from_secs(10)) {
                Ok(s) => return Sender::over(s, addr, compression, key),
                Err(e) => last = Some(e),
            }
        }
        Err(Error::os(
            format!("connecting to the receiver at {addr}"),
            last.unwrap_or_else(|| io::Error::from(io::ErrorKind::AddrNotAvailable)),
        ))
    }

    /// Greets a receiver over a connected stream (with `key`: see
    /// [`Sender::connect_with`]).
    pub fn over(
        stream: TcpStream,
        peer: &str,
        compression: Compression,
        key: Option<&Key>,
    ) -> Result<Sender> {
        let os = |e| Error::os(format!("greeting the receiver at {peer}"), e);
        stream.set_nodelay(true).map_err(os)?;
        stream.set_read_timeout(Some(IDLE_TIMEOUT)).map_err(os)?;
        stream.set_write_timeout(Some(IDLE_TIMEOUT)).map_err(os)?;
        let input = BufReader::new(stream.try_clone().map_err(os)?);
        let mut s = Sender {
            peer: peer.to_string(),
            out: BufWriter::with_capacity(1 << 20, stream),
            input,
            compression,
            sent_regions: Vec::new(),
            begun: false,
            complete: false,
            passes: 0,
            skip_lz4: 0,
            lz4: vec![
                0;
                lz4_flex::block::get_maximum_output_size(MAX_CHUNK_PAGES as usize * PAGE_SIZE)
            ],
            stats: WireStats::default(),
            receiver_snapshots: 0,
            auth: None,
        };
        let flags = if compression == Compression::None {
            0
        } else {
            FLAG_LZ4
        } | if key.is_some() { FLAG_AUTH } else { 0 };
        let mine = nonce()?;
        let mut hello = Vec::with_capacity(HELLO_LEN);
        for v in [MAGIC, VERSION, flags] {
            hello.extend_from_slice(&v.to_le_bytes());
        }
        hello.extend_from_slice(&mine);
        s.send(&hello)?;
        s.flush()?;
        let mut b = [0u8; REPLY_LEN];
        s.recv(&mut b[..20])?;
        let (magic, version, status) = (le_u32(&b, 0), le_u32(&b, 4), le_u32(&b, 8));
        if magic != MAGIC || version != VERSION {
            return Err(wire_err(
                peer,
                format!("the receiver speaks magic {magic:#x} version {version}, want {MAGIC:#x} version {VERSION}"),
            ));
        }
        if status == libc::EACCES as u32 {
            return Err(Error::NotPermitted(format!(
                "the receiver at {peer} refused the connection: {}",
                if key.is_some() {
                    "it has no key (give both ends the same --key)"
                } else {
                    "it needs a key (--key FILE, the same at both ends)"
                }
            )));
        }
        if status != 0 {
            return Err(Error::os(
                format!("the receiver at {peer} refused"),
                io::Error::from_raw_os_error(status as i32),
            ));
        }
        s.recv(&mut b[20..])?;
        s.receiver_snapshots = le_u64(&b, 12);
        s.auth = key.map(|k| Auth::new(k, &mine, &b[20..], true));
        Ok(s)
    }

    /// Ends the message being sent: its tag follows, when authenticated.
    fn end_msg(&mut self) -> Result<()> {
        if let Some(a) = self.auth.as_mut() {
            let t = a.end_sent();
            self.stats.wire_bytes += TAG_LEN as u64;
            self.out
                .write_all(&t)
                .map_err(|e| self.broken("sending to", e))?;
        }
        Ok(())
    }

    /// What has been sent so far.
    pub fn stats(&self) -> WireStats {
        self.stats
    }

    /// The receiver's reason, when it closed the connection with one.
    fn reason(&mut self) -> Option<String> {
        let _ = self
            .input
            .get_ref()
            .set_read_timeout(Some(Duration::from_secs(2)));
        let mut tag = [0u8; 1];
        self.input.read_exact(&mut tag).ok()?;
        if tag[0] != MSG_ERROR {
            return None;
        }
        let mut len = [0u8; 4];
        self.input.read_exact(&mut len).ok()?;
        let n = u32::from_le_bytes(len).min(MAX_REASON);
        let mut text = vec![0u8; n as usize];
        self.input.read_exact(&mut text).ok()?;
        Some(String::from_utf8_lossy(&text).into_owned())
    }

    fn broken(&mut self, doing: &str, e: io::Error) -> Error {
        match self.reason() {
            Some(r) => wire_err(&self.peer, format!("the receiver refused ({r})")),
            None => Error::os(format!("{doing} the receiver at {}", self.peer), e),
        }
    }

    fn send(&mut self, b: &[u8]) -> Result<()> {
        if let Some(a) = self.auth.as_mut() {
            a.sent(b);
        }
        let t = Instant::now();
        let r = self.out.write_all(b);
        self.stats.send_ms += t.elapsed().as_secs_f64() * 1e3;
        self.stats.wire_bytes += b.len() as u64;
        r.map_err(|e| self.broken("sending to", e))
    }

    fn flush(&mut self) -> Result<()> {
        let t = Instant::now();
        let r = self.out.flush();
        self.stats.send_ms += t.elapsed().as_secs_f64() * 1e3;
        r.map_err(|e| self.broken("sending to", e))
    }

    fn recv(&mut self, b: &mut [u8]) -> Result<()> {
        let t = Instant::now();
        let r = self.input.read_exact(b);
        self.stats.send_ms += t.elapsed().as_secs_f64() * 1e3;
        r.map_err(|e| Error::os(format!("waiting for the receiver at {}", self.peer), e))
    }

    /// Reads a reply with tag `want`, or the receiver's refusal.
    fn reply(&mut self, want: u8, body: &mut [u8]) -> Result<()> {
        let mut tag = [0u8; 1];
        self.recv(&mut tag)?;
        if tag[0] == MSG_ERROR {
            let mut len = [0u8; 4];
            self.recv(&mut len)?;
            let mut text = vec![0u8; u32::from_le_bytes(len).min(MAX_REASON) as usize];
            self.recv(&mut text)?;
            return Err(wire_err(
                &self.peer,
                format!("the receiver refused ({})", String::from_utf8_lossy(&text)),
            ));
        }
        if tag[0] != want {
            return Err(wire_err(
                &self.peer,
                format!(
                    "reply {:?} where {:?} was due",
                    tag[0] as char, want as char
                ),
            ));
        }
        self.recv(body)?;
        if self.auth.is_some() {
            let mut t = [0u8; TAG_LEN];
            self.recv(&mut t)?;
            let a = self.auth.as_mut().expect("checked");
            a.read(&tag);
            a.read(body);
            if !a.check_read(&t) {
                return Err(wire_err(
                    &self.peer,
                    "a reply whose authentication tag is wrong (another key?)",
                ));
            }
        }
        Ok(())
    }

    /// Sends the pages `buf` (at `addr`) as one chunk.
    fn chunk(&mut self, addr: u64, buf: &[u8]) -> Result<()> {
        let pages = buf.len() / PAGE_SIZE;
        let mut digests = Vec::with_capacity(pages * 8);
        let mut zero = true;
        for p in buf.chunks_exact(PAGE_SIZE) {
            let h = page_hash(p);
            zero &=
                h == crate::mech::hash::zero_page_hash() && p == &crate::mech::hash::ZERO_PAGE[..];
            digests.extend_from_slice(&h.to_le_bytes());
        }
        let try_lz4 = !zero
            && match self.compression {
                Compression::None => false,
                Compression::Lz4 => true,
                Compression::Auto => self.skip_lz4 == 0,
            };
        let mut enc = if zero { ENC_ZERO } else { ENC_RAW };
        let mut clen = 0;
        if try_lz4 {
            let t = Instant::now();
            clen = lz4_flex::block::compress_into(buf, &mut self.lz4)
                .map_err(|e| Error::Internal(format!("lz4: {e}")))?;
            self.stats.compress_ms += t.elapsed().as_secs_f64() * 1e3;
            if self.compression == Compression::Lz4 || clen <= buf.len() - buf.len() / 8 {
                enc = ENC_LZ4;
            } else {
                self.skip_lz4 = 16;
            }
        } else if self.skip_lz4 > 0 {
            self.skip_lz4 -= 1;
        }
        let payload_len = match enc {
            ENC_ZERO => 0,
            ENC_LZ4 => clen,
            _ => buf.len(),
        };
        let mut h = [0u8; 24];
        h[0] = MSG_PAGES;
        h[1] = enc;
        h[4..8].copy_from_slice(&(pages as u32).to_le_bytes());
        h[8..16].copy_from_slice(&addr.to_le_bytes());
        h[16..20].copy_from_slice(&(payload_len as u32).to_le_bytes());
        self.send(&h)?;
        self.send(&digests)?;
        let sent = match enc {
            ENC_ZERO => {
                self.stats.chunks_zero += 1;
                Ok(())
            }
            ENC_LZ4 => {
                self.stats.chunks_lz4 += 1;
                let lz4 = std::mem::take(&mut self.lz4);
                let r = self.send(&lz4[..clen]);
                self.lz4 = lz4;
                r
            }
            _ => {
                self.stats.chunks_raw += 1;
                self.send(buf)
            }
        };
        sent?;
        self.end_msg()?;
        self.stats.pages += pages as u64;
        self.stats.page_bytes += buf.len() as u64;
        Ok(())
    }
}

impl Destination for Sender {
    fn pass(&mut self, regions: &[(Region, Vec<u8>)], changed: &[PageRange]) -> Result<()> {
        if !self.begun {
            self.send(&[MSG_BEGIN])?;
            self.end_msg()?;
            self.begun = true;
            self.complete = false;
            self.sent_regions.clear();
            self.passes = 0;
        }
        let now: Vec<Region> = regions.iter().map(|(r, _)| *r).collect();
        if now != self.sent_regions {
            if now.len() > MAX_REGIONS as usize {
                return Err(Error::Limit(format!(
                    "{} regions: the wire carries at most {MAX_REGIONS}",
                    now.len()
                )));
            }
            let mut b = Vec::with_capacity(5 + now.len() * 16);
            b.push(MSG_REGIONS);
            b.extend_from_slice(&(now.len() as u32).to_le_bytes());
            for r in &now {
                b.extend_from_slice(&r.start.to_le_bytes());
                b.extend_from_slice(&r.len.to_le_bytes());
            }
            self.send(&b)?;
            self.end_msg()?;
            self.sent_regions = now;
        }
        for c in changed {
            let Some((r, buf)) = regions
                .iter()
                .find(|(r, _)| r.start <= c.start && c.end() <= r.end())
            else {
                return Err(Error::Internal(format!(
                    "changed range {:#x}+{} pages lies in no region of the copy",
                    c.start, c.pages
                )));
            };
            let mut off = (c.start - r.start) as usize;
            let end = off + c.len() as usize;
            while off < end {
                let n = (end - off).min(MAX_CHUNK_PAGES as usize * PAGE_SIZE);
                self.chunk(r.start + off as u64, &buf[off..off + n])?;
                off += n;
            }
        }
        let mut b = [0u8; 5];
        b[0] = MSG_END_PASS;
        b[1..5].copy_from_slice(&self.passes.to_le_bytes());
        self.passes += 1;
        self.send(&b)?;
        self.end_msg()?;
        self.flush()
    }

    fn complete(&mut self) -> Result<()> {
        if self.complete {
            return Ok(());
        }
        self.send(&[MSG_DONE])?;
        self.end_msg()?;
        self.flush()?;
        let mut b = [0u8; 8];
        self.reply(MSG_COMPLETE, &mut b)?;
        self.complete = true;
        Ok(())
    }

    fn finish(
        &mut self,
        _regions: &[(Region, Vec<u8>)],
        pid: i32,
        label: &str,
    ) -> Result<SaveStats> {
        self.complete()?;
        if label.len() > MAX_LABEL as usize {
            return Err(Error::Invalid(format!(
                "label longer than {MAX_LABEL} bytes"
            )));
        }
        let mut b = Vec::with_capacity(13 + label.len());
        b.push(MSG_FINISH);
        b.extend_from_slice(&i64::from(pid).to_le_bytes());
        b.extend_from_slice(&(label.len() as u32).to_le_bytes());
        b.extend_from_slice(label.as_bytes());
        self.send(&b)?;
        self.end_msg()?;
        self.flush()?;
        let mut a = [0u8; 48];
        self.reply(MSG_SAVED, &mut a)?;
        self.begun = false;
        Ok(SaveStats {
            id: le_u64(&a, 0),
            pages: le_u64(&a, 8),
            pages_new: le_u64(&a, 16),
            zero_pages: le_u64(&a, 24),
            pack_bytes: le_u64(&a, 32),
            index_bytes: le_u64(&a, 40),
        })
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        if !self.begun {
            if let Some(a) = self.auth.as_mut() {
                a.sent(&[MSG_QUIT]);
                let t = a.end_sent();
                let _ = self.out.write_all(&[MSG_QUIT]);
                let _ = self.out.write_all(&t);
            } else {
                let _ = self.out.write_all(&[MSG_QUIT]);
            }
            let _ = self.out.flush();
        }
    }
}

/// What a receiver heard on one connection.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Received {
    /// The peer.
    pub peer: String,
    /// Snapshots saved, in order.
    pub saved: Vec<SaveStats>,
    /// Pages received (all passes).
    pub pages: u64,
    /// Bytes read from the connection.
    pub wire_bytes: u64,
    /// Passes of the snapshot in progress or last saved.
    pub passes: u32,
    /// How the connection ended, when not cleanly: the copy in progress was
    /// discarded and the store holds its last complete snapshot.
    pub broken: Option<String>,
}

/// Events a receiver reports while it serves a connection.
#[derive(Debug)]
pub enum Event<'a> {
    /// A pass arrived (its number, pages so far in this snapshot).
    Pass(u32, u64),
    /// A snapshot was saved.
    Saved(&'a SaveStats),
}

/// The receiving side: keeps the copy of one snapshot per connection and
/// saves complete ones into its store. Connections may be served from
/// several threads at once ([`Receiver::serve`] takes `&self`); saves into
/// the store take turns.
pub struct Receiver {
    store: std::sync::Mutex<DiskStore>,
    /// Most bytes a copy may hold (regions summed), per connection.
    pub max_bytes: u64,
    /// Silence after which a connection is given up.
    pub idle: Duration,
    /// Longest a connection may last in all.
    pub max_time: Duration,
    /// Most connections served at once; more are refused (`EBUSY`).
    pub max_connections: usize,
    key: Option<Key>,
    serving: std::sync::atomic::AtomicUsize,
}

/// The copy being received.
#[derive(Default)]
struct Mirror {
    regions: Vec<(Region, Vec<u8>)>,
    pages: u64,
    /// Pages written in this snapshot.
    changed: Vec<PageRange>,
    /// The snapshot this copy was last saved as.
    saved: Option<super::disk::DiskSnapshot>,
}

enum State {
    Greeting,
    Idle,
    Copying(Mirror),
    Complete(Mirror),
}

/// A connection's two ends, counting what is read, giving up after its
/// deadline, and authenticating each message when there is a key.
struct Conn<R, W> {
    input: R,
    out: W,
    n: u64,
    deadline: Instant,
    max_time: Duration,
    auth: Option<Auth>,
}

impl<R: Read, W: Write> Conn<R, W> {
    /// Reads exactly `b`, part of the message being read.
    fn read(&mut self, b: &mut [u8]) -> io::Result<()> {
        if Instant::now() > self.deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "timed out: the connection lasted longer than {} s",
                    self.max_time.as_secs()
                ),
            ));
        }
        self.input.read_exact(b)?;
        self.n += b.len() as u64;
        if let Some(a) = self.auth.as_mut() {
            a.read(b);
        }
        Ok(())
    }

    /// The message read since the last one is whole: its tag, when
    /// authenticated, is read and checked. `false` when it is wrong.
    fn authentic(&mut self) -> io::Result<bool> {
        if self.auth.is_none() {
            return Ok(true);
        }
        let mut t = [0u8; TAG_LEN];
        self.input.read_exact(&mut t)?;
        self.n += TAG_LEN as u64;
        Ok(self.auth.as_mut().expect("checked").check_read(&t))
    }

    /// Sends one whole message (its tag after it when authenticated).
    fn send(&mut self, b: &[u8]) -> io::Result<()> {
        self.out.write_all(b)?;
        if let Some(a) = self.auth.as_mut() {
            a.sent(b);
            let t = a.end_sent();
            self.out.write_all(&t)?;
        }
        self.out.flush()
    }
}

/// Why a connection ended early: the peer's fault (answered with `'X'`) or
/// the connection's (nothing to answer).
enum Stop {
    Refuse(String),
    Broken(String),
    Local(Error),
}

impl Receiver {
    /// A receiver saving into `store`, without a key (for loopback), with
    /// a per-connection cap of half the memory available now, an idle limit
    /// of [`IDLE_TIMEOUT`], connections of at most an hour, 8 at once.
    pub fn new(store: DiskStore) -> Receiver {
        let max_bytes = crate::mech::procfs::read_trimmed("/proc/meminfo")
            .ok()
            .and_then(|t| crate::mech::procfs::status_field(&t, "MemAvailable"))
            .map_or(u64::MAX, |kib| kib * 1024 / 2);
        Receiver {
            store: std::sync::Mutex::new(store),
            max_bytes,
            idle: IDLE_TIMEOUT,
            max_time: Duration::from_secs(3600),
            max_connections: 8,
            key: None,
            serving: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Authenticates every message with `key` (see the module); senders
    /// without it are refused.
    pub fn with_key(mut self, key: Key) -> Receiver {
        self.key = Some(key);
        self
    }

    /// The store (held while the guard lives: saves wait for it).
    pub fn store(&self) -> std::sync::MutexGuard<'_, DiskStore> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves one connection to its end. Errors of the store are returned;
    /// a peer that breaks the protocol or the connection, or times out, is
    /// reported in [`Received::broken`].
    pub fn serve(&self, stream: TcpStream, events: &mut dyn FnMut(Event<'_>)) -> Result<Received> {
        use std::sync::atomic::Ordering;
        let peer = stream
            .peer_addr()
            .map_or_else(|_| "?".to_string(), |a| a.to_string());
        let os = |e| Error::os(format!("setting up the connection with {peer}"), e);
        stream.set_nodelay(true).map_err(os)?;
        stream.set_read_timeout(Some(self.idle)).map_err(os)?;
        stream.set_write_timeout(Some(self.idle)).map_err(os)?;
        let out = BufWriter::new(stream.try_clone().map_err(os)?);
        let mut c = Conn {
            input: BufReader::with_capacity(1 << 20, stream),
            out,
            n: 0,
            deadline: Instant::now() + self.max_time,
            max_time: self.max_time,
            auth: None,
        };
        let mut got = Received {
            peer: peer.clone(),
            ..Received::default()
        };
        let busy = self.serving.fetch_add(1, Ordering::SeqCst) >= self.max_connections;
        let mut state = State::Greeting;
        let r = self.run(&mut c, &mut state, &mut got, busy, events);
        self.serving.fetch_sub(1, Ordering::SeqCst);
        got.wire_bytes = c.n;
        let in_progress = matches!(state, State::Copying(_) | State::Complete(_));
        match r {
            Ok(()) => Ok(got),
            Err(Stop::Local(e)) => {
                let _ = refuse(&mut c.out, &e.to_string());
                Err(e)
            }
            Err(Stop::Refuse(why)) => {
                let _ = refuse(&mut c.out, &why);
                got.broken = Some(why);
                Ok(got)
            }
            Err(Stop::Broken(why)) => {
                got.broken = Some(if in_progress {
                    format!("{why}; the snapshot in progress was discarded")
                } else {
                    why
                });
                Ok(got)
            }
        }
    }

    fn run<R: Read, W: Write>(
        &self,
        c: &mut Conn<R, W>,
        state: &mut State,
        got: &mut Received,
        busy: bool,
        events: &mut dyn FnMut(Event<'_>),
    ) -> std::result::Result<(), Stop> {
        let idle = self.idle;
        let broken = |e: io::Error| {
            Stop::Broken(if e.kind() == io::ErrorKind::UnexpectedEof {
                "the sender closed the connection".to_string()
            } else if e.kind() == io::ErrorKind::TimedOut && e.get_ref().is_some() {
                e.to_string()
            } else if matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ) {
                format!("timed out: the sender was silent for {} s", idle.as_secs())
            } else {
                format!("the connection broke: {e}")
            })
        };
        // The hello: not authenticated itself, but both nonces go into
        // every tag after it.
        let mut hello = [0u8; HELLO_LEN];
        c.read(&mut hello[..12]).map_err(broken)?;
        let version_ok = le_u32(&hello, 0) == MAGIC && le_u32(&hello, 4) == VERSION;
        if version_ok {
            c.read(&mut hello[12..]).map_err(broken)?;
        }
        let flags = le_u32(&hello, 8);
        let keys_agree = (flags & FLAG_AUTH != 0) == self.key.is_some();
        let status = if !version_ok {
            libc::EPROTO
        } else if !keys_agree {
            libc::EACCES
        } else if busy {
            libc::EBUSY
        } else {
            0
        };
        let mine = nonce().map_err(Stop::Local)?;
        let mut reply = Vec::with_capacity(REPLY_LEN);
        reply.extend_from_slice(&MAGIC.to_le_bytes());
        reply.extend_from_slice(&VERSION.to_le_bytes());
        reply.extend_from_slice(&(status as u32).to_le_bytes());
        let have = if status == 0 {
            self.store().ids().map_err(Stop::Local)?.len() as u64
        } else {
            0
        };
        reply.extend_from_slice(&have.to_le_bytes());
        if status == 0 {
            reply.extend_from_slice(&mine);
        }
        c.out.write_all(&reply).map_err(broken)?;
        c.out.flush().map_err(broken)?;
        match status {
            0 => {}
            libc::EPROTO => {
                return Err(Stop::Broken(format!(
                    "the sender speaks magic {:#x} version {}, want {MAGIC:#x} version {VERSION}",
                    le_u32(&hello, 0),
                    le_u32(&hello, 4)
                )))
            }
            libc::EACCES => {
                return Err(Stop::Broken(if self.key.is_some() {
                    "refused: the sender has no key (this receiver needs --key)".into()
                } else {
                    "refused: the sender authenticates with a key this receiver lacks".into()
                }))
            }
            _ => {
                return Err(Stop::Broken(format!(
                    "refused: {} connections are being served already",
                    self.max_connections
                )))
            }
        }
        if let Some(k) = &self.key {
            c.auth = Some(Auth::new(k, &hello[12..], &mine, false));
        }
        // Every message: its bytes, then its tag checked before it acts.
        macro_rules! checked {
            () => {
                if !c.authentic().map_err(broken)? {
                    return Err(Stop::Refuse(
                        "a message whose authentication tag is wrong (another key?)".into(),
                    ));
                }
            };
        }
        *state = State::Idle;
        let mut last: Option<Mirror> = None;
        let mut payload = Vec::new();
        loop {
            let mut tag = [0u8; 1];
            match c.read(&mut tag) {
                Ok(()) => {}
                Err(e)
                    if e.kind() == io::ErrorKind::UnexpectedEof && matches!(state, State::Idle) =>
                {
                    return Ok(())
                }
                Err(e) => return Err(broken(e)),
            }
            match (tag[0], &mut *state) {
                (MSG_QUIT, State::Idle) => {
                    checked!();
                    return Ok(());
                }
                (MSG_BEGIN, State::Idle) => {
                    checked!();
                    got.passes = 0;
                    let mut m = last.take().unwrap_or_default();
                    m.pages = 0;
                    m.changed.clear();
                    *state = State::Copying(m);
                }
                (MSG_REGIONS, State::Copying(m)) => {
                    let mut n = [0u8; 4];
                    c.read(&mut n).map_err(broken)?;
                    let n = u32::from_le_bytes(n);
                    if n > MAX_REGIONS {
                        return Err(Stop::Refuse(format!(
                            "{n} regions, more than {MAX_REGIONS}"
                        )));
                    }
                    let mut b = vec![0u8; n as usize * 16];
                    c.read(&mut b).map_err(broken)?;
                    checked!();
                    let mut now = Vec::with_capacity(n as usize);
                    let mut total = 0u64;
                    for i in 0..n as usize {
                        let r = Region::new(le_u64(&b, i * 16), le_u64(&b, i * 16 + 8))
                            .map_err(|e| Stop::Refuse(format!("region {i}: {e}")))?;
                        total = total.saturating_add(r.len);
                        now.push(r);
                    }
                    if total > self.max_bytes {
                        return Err(Stop::Refuse(format!(
                            "regions of {total} bytes, more than this receiver holds ({} bytes)",
                            self.max_bytes
                        )));
                    }
                    let mut sorted = now.clone();
                    sorted.sort_by_key(|r| r.start);
                    if sorted.windows(2).any(|w| w[0].end() > w[1].start) {
                        return Err(Stop::Refuse("regions overlap".into()));
                    }
                    let mut old = std::mem::take(&mut m.regions);
                    for r in sorted {
                        match old.iter().position(|(o, _)| *o == r) {
                            Some(i) => m.regions.push(old.swap_remove(i)),
                            None => m.regions.push((r, vec![0u8; r.len as usize])),
                        }
                    }
                }
                (MSG_PAGES, State::Copying(m)) => {
                    let mut h = [0u8; 23];
                    c.read(&mut h).map_err(broken)?;
                    let (enc, pages, addr, plen) =
                        (h[0], le_u32(&h, 3), le_u64(&h, 7), le_u32(&h, 15) as usize);
                    if h[1..3] != [0, 0] || h[19..23] != [0; 4] {
                        return Err(Stop::Refuse("a chunk header with non-zero padding".into()));
                    }
                    if pages == 0 || pages > MAX_CHUNK_PAGES {
                        return Err(Stop::Refuse(format!("a chunk of {pages} pages")));
                    }
                    let bytes = pages as usize * PAGE_SIZE;
                    let plen_ok = match enc {
                        ENC_RAW => plen == bytes,
                        ENC_LZ4 => plen <= lz4_flex::block::get_maximum_output_size(bytes),
                        ENC_ZERO => plen == 0,
                        _ => false,
                    };
                    if !plen_ok {
                        return Err(Stop::Refuse(format!(
                            "a chunk of encoding {enc} with a payload of {plen} bytes for {pages} pages"
                        )));
                    }
                    let mut digests = vec![0u8; pages as usize * 8];
                    c.read(&mut digests).map_err(broken)?;
                    payload.resize(plen, 0);
                    c.read(&mut payload).map_err(broken)?;
                    checked!();
                    if addr % PAGE_SIZE as u64 != 0 {
                        return Err(Stop::Refuse(format!("pages at unaligned {addr:#x}")));
                    }
                    let Some((off, buf)) = m
                        .regions
                        .iter_mut()
                        .find_map(|(r, buf)| Some((r.offset_of(addr, bytes as u64)?, buf)))
                    else {
                        return Err(Stop::Refuse(format!(
                            "pages at {addr:#x}+{pages} lie in no region"
                        )));
                    };
                    let Some(dst) = buf.get_mut(off..off + bytes) else {
                        return Err(Stop::Refuse(format!(
                            "pages at {addr:#x}+{pages} lie in no region"
                        )));
                    };
                    match enc {
                        ENC_RAW => dst.copy_from_slice(&payload),
                        ENC_ZERO => dst.fill(0),
                        _ => {
                            // Straight into the copy: a chunk that fails is
                            // refused and the copy dropped with it.
                            let n =
                                lz4_flex::block::decompress_into(&payload, dst).map_err(|e| {
                                    Stop::Refuse(format!("LZ4 chunk at {addr:#x}: {e}"))
                                })?;
                            if n != bytes {
                                return Err(Stop::Refuse(format!(
                                    "LZ4 chunk at {addr:#x} holds {n} bytes, not {bytes}"
                                )));
                            }
                        }
                    }
                    for (i, p) in dst.chunks_exact(PAGE_SIZE).enumerate() {
                        if page_hash(p) != le_u64(&digests, i * 8) {
                            return Err(Stop::Refuse(format!(
                                "page {:#x}: its digest does not match its contents",
                                addr + (i * PAGE_SIZE) as u64
                            )));
                        }
                    }
                    m.pages += u64::from(pages);
                    got.pages += u64::from(pages);
                    crate::mech::region::push_coalesced(&mut m.changed, addr, addr + bytes as u64);
                }
                (MSG_END_PASS, State::Copying(m)) => {
                    let mut n = [0u8; 4];
                    c.read(&mut n).map_err(broken)?;
                    checked!();
                    got.passes = u32::from_le_bytes(n) + 1;
                    events(Event::Pass(got.passes - 1, m.pages));
                }
                (MSG_DONE, State::Copying(m)) => {
                    checked!();
                    let held: u64 = m.regions.iter().map(|(r, _)| r.pages()).sum();
                    let mut b = [0u8; 9];
                    b[0] = MSG_COMPLETE;
                    b[1..].copy_from_slice(&held.to_le_bytes());
                    c.send(&b).map_err(broken)?;
                    let State::Copying(m) = std::mem::replace(state, State::Idle) else {
                        unreachable!("matched above")
                    };
                    *state = State::Complete(m);
                }
                (MSG_FINISH, State::Complete(_)) => {
                    let mut h = [0u8; 12];
                    c.read(&mut h).map_err(broken)?;
                    let (pid, len) = (le_u64(&h, 0) as i64, le_u32(&h, 8));
                    if len > MAX_LABEL {
                        return Err(Stop::Refuse(format!("a label of {len} bytes")));
                    }
                    let mut label = vec![0u8; len as usize];
                    c.read(&mut label).map_err(broken)?;
                    checked!();
                    let label = String::from_utf8(label)
                        .map_err(|_| Stop::Refuse("a label that is not UTF-8".into()))?;
                    let pid = i32::try_from(pid).ok().filter(|p| *p > 0);
                    let State::Complete(mut m) = std::mem::replace(state, State::Idle) else {
                        unreachable!("matched above")
                    };
                    // Pages not sent in this snapshot are those of the last.
                    crate::mech::region::normalize(&mut m.changed);
                    let since = m.saved.as_ref().map(|p| (p, &m.changed[..]));
                    let (s, saved) = {
                        let mut store = self.store();
                        let s = store
                            .save(&m.regions, pid, &label, since)
                            .map_err(Stop::Local)?;
                        let saved = store.load(s.id).map_err(Stop::Local)?;
                        (s, saved)
                    };
                    m.saved = Some(saved);
                    last = Some(m);
                    let mut b = Vec::with_capacity(49);
                    b.push(MSG_SAVED);
                    for v in [
                        s.id,
                        s.pages,
                        s.pages_new,
                        s.zero_pages,
                        s.pack_bytes,
                        s.index_bytes,
                    ] {
                        b.extend_from_slice(&v.to_le_bytes());
                    }
                    events(Event::Saved(&s));
                    got.saved.push(s);
                    c.send(&b).map_err(broken)?;
                }
                (t, s) => {
                    let in_state = match s {
                        State::Greeting => "greeting",
                        State::Idle => "idle",
                        State::Copying(_) => "copying",
                        State::Complete(_) => "complete",
                    };
                    return Err(Stop::Refuse(format!(
                        "message {:?} ({t:#04x}) where the receiver is {in_state}",
                        t as char
                    )));
                }
            }
        }
    }
}

fn refuse(out: &mut impl Write, why: &str) -> io::Result<()> {
    let text = &why.as_bytes()[..why.len().min(MAX_REASON as usize)];
    out.write_all(&[MSG_ERROR])?;
    out.write_all(&(text.len() as u32).to_le_bytes())?;
    out.write_all(text)?;
    out.flush()
}
