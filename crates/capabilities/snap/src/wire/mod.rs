//! Memory migration: the passes of a live checkpoint
//! ([`live_snapshot`](super::live::live_snapshot)) streamed over TCP from a
//! [`Sender`] (`pagewise snapshot --live --to HOST:PORT`) to a [`Receiver`]
//! (`pagewise receive --listen ADDR --out DIR`), which keeps a copy of the
//! process's memory and saves it, once complete, as an ordinary snapshot in
//! its [`DiskStore`](super::DiskStore).
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
//! ([`page_hash`](pagewise_mech::hash::page_hash)) of its uncompressed contents, then the payload. The
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
//! Limits: a receiver holds at most [`Receiver::max_bytes`] for all its
//! connections together (the regions each sender declares, refused beyond;
//! a chunk of zero pages commits no memory where the copy holds zeros
//! already), serves connections
//! concurrently (at most [`Receiver::max_connections`]; more are refused
//! with status `EBUSY`), and gives a connection up when it is silent for
//! [`Receiver::idle`] or lasts longer than [`Receiver::max_time`] in all
//! ("timed out").
//!
//! Compression: with [`Compression::Auto`] a chunk is sent LZ4-compressed
//! when that saves at least an eighth of its bytes and, once the sender has
//! measured the link's rate (raw bytes sent over the time spent sending
//! them, which includes waiting for the receiver; one chunk in 16 goes raw
//! to keep measuring it) and LZ4's (bytes compressed over the time spent
//! compressing), when compressing, sending the smaller chunk and
//! decompressing it (taken as a third of compressing) takes a tenth less
//! time than sending it raw: on a link faster than LZ4 (loopback, a fast
//! network) pages go raw. A chunk not sent compressed has the next 16 sent
//! raw (64 when the link is too fast), then LZ4 is tried again: the
//! contents and the rates change. All-zero chunks are sent as zero pages
//! whatever the setting.

mod auth;
mod confine;
mod receive;
mod send;

pub use crate::error::WireError;
pub use receive::{Event, Received, Receiver};
pub use send::Sender;

use crate::{Error, Result};
use serde::Serialize;
use std::io::Read;
use std::time::Duration;

/// `PGWM`.
pub const MAGIC: u32 = 0x4d57_4750;
/// Protocol version.
pub const VERSION: u32 = 2;
/// Hello flag: the sender may send LZ4 chunks.
pub(crate) const FLAG_LZ4: u32 = 1;
/// Hello flag: every message is authenticated (see the module).
pub const FLAG_AUTH: u32 = 2;
/// Bytes of a hello's nonce.
pub const NONCE_LEN: usize = 16;
/// Bytes of a message's authentication tag.
pub(crate) const TAG_LEN: usize = 32;
/// Bytes of the sender's hello.
pub const HELLO_LEN: usize = 12 + NONCE_LEN;
/// Bytes of the receiver's hello.
pub const REPLY_LEN: usize = 20 + NONCE_LEN;
/// Most pages in one pages message.
pub const MAX_CHUNK_PAGES: u32 = 256;
/// Most regions in one regions message.
pub(crate) const MAX_REGIONS: u32 = 1 << 20;
/// Longest label.
pub(crate) const MAX_LABEL: u32 = 4096;
/// Longest error text.
const MAX_REASON: u32 = 1 << 16;
/// Encoding: raw pages.
pub(crate) const ENC_RAW: u8 = 0;
/// Encoding: one LZ4 block of the pages.
pub(crate) const ENC_LZ4: u8 = 1;
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
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Whether the sender compresses pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Compression {
    /// Raw pages (zero pages still sent as such).
    None,
    /// LZ4 where it saves at least an eighth and the link is slower than
    /// compressing (see the module).
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
            return Err(WireError::ShortKey { len: bytes.len() }.into());
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
            return Err(WireError::KeyNotPrivate {
                path: path.to_path_buf(),
                mode: md.mode() & 0o7777,
                owner: md.uid(),
            }
            .into());
        }
        let mut b = Vec::new();
        f.take(4096)
            .read_to_end(&mut b)
            .map_err(|e| Error::os(format!("reading the key {}", path.display()), e))?;
        let t = b.trim_ascii();
        Key::from_bytes(t)
    }
}

/// What a sender put on the wire.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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

fn le_u32(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"))
}

fn le_u64(b: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"))
}
