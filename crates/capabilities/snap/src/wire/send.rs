//! The sending side of a migration: each pass of a live checkpoint
//! streamed to a receiver, in chunks (raw, LZ4 or zero), each page with its
//! digest.

use super::auth::{nonce, Auth};
use super::*;
use crate::disk::SaveStats;
use crate::live::Destination;
use pagewise_mech::hash::page_hash;
use pagewise_mech::{PageRange, Region, PAGE_SIZE};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Instant;

/// The sending side: a [`Destination`] for
/// [`live_snapshot`](crate::live::live_snapshot) that streams each pass to
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
    /// Bytes given to LZ4 and what it made of them (the compression rate
    /// and ratio of [`Compression::Auto`]).
    lz4_in: u64,
    lz4_out: u64,
    /// Raw page bytes sent and the time sending them took, ms (the link's
    /// rate for [`Compression::Auto`]).
    raw_bytes: u64,
    raw_ms: f64,
    /// Chunks sent since the last raw one.
    since_raw: u32,
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
            .map_err(|e| WireError::BadAddress {
                addr: addr.to_string(),
                why: e.to_string(),
            })?
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
    pub(crate) fn over(
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
            lz4_in: 0,
            lz4_out: 0,
            raw_bytes: 0,
            raw_ms: 0.0,
            since_raw: 0,
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
            return Err(WireError::OtherVersion {
                peer: peer.to_string(),
                magic,
                version,
                want_magic: MAGIC,
                want_version: VERSION,
            }
            .into());
        }
        if status == libc::EACCES as u32 {
            return Err(WireError::KeyMismatch {
                peer: peer.to_string(),
                we_have_key: key.is_some(),
            }
            .into());
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
            Some(r) => WireError::Refused {
                peer: self.peer.clone(),
                reason: r,
            }
            .into(),
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
            return Err(WireError::Refused {
                peer: self.peer.clone(),
                reason: String::from_utf8_lossy(&text).into_owned(),
            }
            .into());
        }
        if tag[0] != want {
            return Err(WireError::UnexpectedReply {
                peer: self.peer.clone(),
                got: tag[0],
                want,
            }
            .into());
        }
        self.recv(body)?;
        if self.auth.is_some() {
            let mut t = [0u8; TAG_LEN];
            self.recv(&mut t)?;
            let a = self.auth.as_mut().expect("checked");
            a.read(&tag);
            a.read(body);
            if !a.check_read(&t) {
                return Err(WireError::BadTag {
                    peer: self.peer.clone(),
                }
                .into());
            }
        }
        Ok(())
    }

    /// Whether compressing pays on this link, from the rates measured so
    /// far: a byte costs `1/link` sent raw, `1/compress + ratio/link`
    /// compressed (one thread does both); it must save a tenth. `None`
    /// until both rates are known.
    fn lz4_pays(&self) -> Option<bool> {
        if self.raw_ms < 0.5 || self.stats.compress_ms < 0.1 || self.lz4_in == 0 {
            return None;
        }
        let link = self.raw_bytes as f64 / self.raw_ms;
        let compress = self.lz4_in as f64 / self.stats.compress_ms;
        let ratio = self.lz4_out as f64 / self.lz4_in as f64;
        // The receiver decompresses too: LZ4 decodes about three times as
        // fast as it encodes.
        Some(1.0 / compress + 1.0 / (3.0 * compress) + ratio / link < 0.9 / link)
    }

    /// Sends the pages `buf` (at `addr`) as one chunk.
    fn chunk(&mut self, addr: u64, buf: &[u8]) -> Result<()> {
        let pages = buf.len() / PAGE_SIZE;
        let mut digests = Vec::with_capacity(pages * 8);
        let mut zero = true;
        for p in buf.chunks_exact(PAGE_SIZE) {
            let h = page_hash(p);
            zero &= h == pagewise_mech::hash::zero_page_hash()
                && p == &pagewise_mech::hash::ZERO_PAGE[..];
            digests.extend_from_slice(&h.to_le_bytes());
        }
        // Auto sends one chunk in 16 raw whatever it saves: the link's
        // rate is measured on raw bytes only.
        let probe_raw = self.compression == Compression::Auto && self.since_raw >= 15;
        let try_lz4 = !zero
            && !probe_raw
            && match self.compression {
                Compression::None => false,
                Compression::Lz4 => true,
                Compression::Auto => self.skip_lz4 == 0,
            };
        let mut enc = if zero { ENC_ZERO } else { ENC_RAW };
        let mut clen = 0;
        if try_lz4 {
            let t = Instant::now();
            clen = lz4_flex::block::compress_into(buf, &mut self.lz4).map_err(|_| {
                Error::Internal {
                    what: "lz4 found its output buffer too small",
                }
            })?;
            self.stats.compress_ms += t.elapsed().as_secs_f64() * 1e3;
            self.lz4_in += buf.len() as u64;
            self.lz4_out += clen as u64;
            let saves = clen <= buf.len() - buf.len() / 8;
            let pays = self.lz4_pays();
            if self.compression == Compression::Lz4 || (saves && pays != Some(false)) {
                enc = ENC_LZ4;
            } else {
                // Tried again now and then: the rates and the contents change.
                self.skip_lz4 = if pays == Some(false) { 64 } else { 16 };
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
                self.since_raw = 0;
                let t = Instant::now();
                let r = self.send(buf);
                self.raw_ms += t.elapsed().as_secs_f64() * 1e3;
                self.raw_bytes += buf.len() as u64;
                r
            }
        };
        if enc != ENC_RAW {
            self.since_raw += 1;
        }
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
                return Err(WireError::TooManyRegions {
                    n: now.len(),
                    max: MAX_REGIONS,
                }
                .into());
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
                return Err(Error::Internal {
                    what: "a changed range lies in no region of the copy",
                });
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
            return Err(WireError::LabelTooLong { max: MAX_LABEL }.into());
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
