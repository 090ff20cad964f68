//! The receiving side of a migration: one copy per connection, every
//! byte of the peer's checked before it is used, complete snapshots saved
//! into the store.

use super::auth::{nonce, Auth};
use super::*;
use crate::disk::{DiskSnapshot, DiskStore, SaveStats};
use pagewise_mech::hash::page_hash;
use pagewise_mech::{PageRange, Region, PAGE_SIZE};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::time::Instant;

/// What a receiver heard on one connection.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
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
#[non_exhaustive]
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
    /// Most bytes the copies of all connections together may hold (the
    /// regions each sender declares, summed).
    pub max_bytes: u64,
    /// Silence after which a connection is given up.
    pub idle: Duration,
    /// Longest a connection may last in all.
    pub max_time: Duration,
    /// Most connections served at once; more are refused (`EBUSY`).
    pub max_connections: usize,
    key: Option<Key>,
    serving: std::sync::atomic::AtomicUsize,
    /// Bytes the copies of all connections hold now.
    holding: std::sync::atomic::AtomicU64,
}

/// The copy being received.
#[derive(Default)]
struct Mirror {
    regions: Vec<(Region, Vec<u8>)>,
    pages: u64,
    /// Pages written in this snapshot.
    changed: Vec<PageRange>,
    /// The snapshot this copy was last saved as.
    saved: Option<DiskSnapshot>,
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
    /// Silence after which the connection is given up (for the message).
    idle: Duration,
    auth: Option<Auth>,
    /// Until the greeting (and, with a key, the first authenticated
    /// message) is done: when it must be.
    handshake_until: Option<Instant>,
    /// The user of a peer on this machine, where it is not this one's.
    foreign_user: Option<u32>,
    /// Bytes this connection's copy holds, counted in the receiver's.
    held: u64,
}

impl<R: Read, W: Write> Conn<R, W> {
    /// Reads exactly `b`, part of the message being read.
    fn read(&mut self, b: &mut [u8]) -> io::Result<()> {
        self.fill(b)?;
        self.n += b.len() as u64;
        if let Some(a) = self.auth.as_mut() {
            a.read(b);
        }
        Ok(())
    }

    /// Fills `b` from the input. The deadlines hold inside a message: a
    /// peer trickling a byte at a time is timed out when the connection
    /// (or its handshake) has lasted too long, at most one idle period
    /// late.
    fn fill(&mut self, b: &mut [u8]) -> io::Result<()> {
        let mut done = 0;
        loop {
            let now = Instant::now();
            if self.handshake_until.is_some_and(|h| now > h) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "timed out: the sender did not complete its greeting within {} s",
                        self.idle.as_secs()
                    ),
                ));
            }
            if now > self.deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "timed out: the connection lasted longer than {} s",
                        self.max_time.as_secs()
                    ),
                ));
            }
            if done == b.len() {
                return Ok(());
            }
            match self.input.read(&mut b[done..]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The message read since the last one is whole: its tag, when
    /// authenticated, is read and checked. `false` when it is wrong.
    fn authentic(&mut self) -> io::Result<bool> {
        if self.auth.is_none() {
            return Ok(true);
        }
        let mut t = [0u8; TAG_LEN];
        self.fill(&mut t)?;
        self.n += TAG_LEN as u64;
        let ok = self.auth.as_mut().expect("checked").check_read(&t);
        if ok {
            // The peer holds the key: its handshake is done.
            self.handshake_until = None;
        }
        Ok(ok)
    }

    /// Why the connection ended, from the error a read or write met.
    fn broken(&self, e: io::Error) -> Stop {
        Stop::Broken(if e.kind() == io::ErrorKind::UnexpectedEof {
            "the sender closed the connection".to_string()
        } else if e.kind() == io::ErrorKind::TimedOut && e.get_ref().is_some() {
            e.to_string()
        } else if matches!(
            e.kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
        ) {
            format!(
                "timed out: the sender was silent for {} s",
                self.idle.as_secs()
            )
        } else {
            format!("the connection broke: {e}")
        })
    }

    /// [`Conn::read`], a failure said as why the connection ended.
    fn get(&mut self, b: &mut [u8]) -> std::result::Result<(), Stop> {
        self.read(b).map_err(|e| self.broken(e))
    }

    /// [`Conn::authentic`]: a message whose tag is wrong is refused.
    fn checked(&mut self) -> std::result::Result<(), Stop> {
        if self.authentic().map_err(|e| self.broken(e))? {
            Ok(())
        } else {
            Err(Stop::Refuse(
                "a message whose authentication tag is wrong (another key?)".into(),
            ))
        }
    }

    /// [`Conn::send`], a failure said as why the connection ended.
    fn put(&mut self, b: &[u8]) -> std::result::Result<(), Stop> {
        self.send(b).map_err(|e| self.broken(e))
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

/// The user of the peer of a connection (`(local, peer)` addresses) that
/// runs on this machine as another user than this process's; `None` for
/// this user's own, or a peer on another machine.
fn local_peer_user(
    addrs: &(Option<std::net::SocketAddr>, Option<std::net::SocketAddr>),
) -> Option<u32> {
    let (Some(local), Some(peer)) = *addrs else {
        return None;
    };
    let uid = pagewise_mech::procfs::tcp_owner(peer, local)?;
    (uid != pagewise_sys::process::geteuid()).then_some(uid)
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
    /// a cap of half the memory available now for all its copies, an idle limit
    /// of 60 s, connections of at most an hour, 8 at once.
    pub fn new(store: DiskStore) -> Receiver {
        let max_bytes = pagewise_mech::procfs::read_trimmed("/proc/meminfo")
            .ok()
            .and_then(|t| pagewise_mech::procfs::status_field(&t, "MemAvailable"))
            .map_or(u64::MAX, |kib| kib * 1024 / 2);
        Receiver {
            store: std::sync::Mutex::new(store),
            max_bytes,
            idle: IDLE_TIMEOUT,
            max_time: Duration::from_secs(3600),
            max_connections: 8,
            key: None,
            serving: std::sync::atomic::AtomicUsize::new(0),
            holding: std::sync::atomic::AtomicU64::new(0),
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
        let stream_addrs = (stream.local_addr().ok(), stream.peer_addr().ok());
        let out = BufWriter::new(stream.try_clone().map_err(os)?);
        let mut c = Conn {
            input: BufReader::with_capacity(1 << 20, stream),
            out,
            n: 0,
            deadline: Instant::now() + self.max_time,
            max_time: self.max_time,
            idle: self.idle,
            auth: None,
            handshake_until: Some(Instant::now() + self.idle),
            foreign_user: local_peer_user(&stream_addrs),
            held: 0,
        };
        let mut got = Received {
            peer: peer.clone(),
            ..Received::default()
        };
        let busy = self.serving.fetch_add(1, Ordering::SeqCst) >= self.max_connections;
        let mut state = State::Greeting;
        let r = self.run(&mut c, &mut state, &mut got, busy, events);
        self.serving.fetch_sub(1, Ordering::SeqCst);
        self.holding.fetch_sub(c.held, Ordering::SeqCst);
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

    /// Serves the connection: the greeting, then messages until the sender
    /// quits, closes between snapshots, or breaks the protocol.
    fn run<R: Read, W: Write>(
        &self,
        c: &mut Conn<R, W>,
        state: &mut State,
        got: &mut Received,
        busy: bool,
        events: &mut dyn FnMut(Event<'_>),
    ) -> std::result::Result<(), Stop> {
        self.greet(c, busy)?;
        if c.auth.is_none() {
            c.handshake_until = None;
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
                Err(e) => return Err(c.broken(e)),
            }
            match (tag[0], &mut *state) {
                (MSG_QUIT, State::Idle) => {
                    c.checked()?;
                    return Ok(());
                }
                (MSG_BEGIN, State::Idle) => {
                    c.checked()?;
                    got.passes = 0;
                    let mut m = last.take().unwrap_or_default();
                    m.pages = 0;
                    m.changed.clear();
                    *state = State::Copying(m);
                }
                (MSG_REGIONS, State::Copying(m)) => self.regions(c, m)?,
                (MSG_PAGES, State::Copying(m)) => got.pages += pages(c, m, &mut payload)?,
                (MSG_END_PASS, State::Copying(m)) => {
                    let mut n = [0u8; 4];
                    c.get(&mut n)?;
                    c.checked()?;
                    got.passes = u32::from_le_bytes(n) + 1;
                    events(Event::Pass(got.passes - 1, m.pages));
                }
                (MSG_DONE, State::Copying(m)) => {
                    c.checked()?;
                    let held: u64 = m.regions.iter().map(|(r, _)| r.pages()).sum();
                    let mut b = [0u8; 9];
                    b[0] = MSG_COMPLETE;
                    b[1..].copy_from_slice(&held.to_le_bytes());
                    c.put(&b)?;
                    let State::Copying(m) = std::mem::replace(state, State::Idle) else {
                        unreachable!("matched above")
                    };
                    *state = State::Complete(m);
                }
                (MSG_FINISH, State::Complete(_)) => {
                    let State::Complete(m) = std::mem::replace(state, State::Idle) else {
                        unreachable!("matched above")
                    };
                    last = Some(self.finish(c, m, got, events)?);
                }
                (t, s) => return Err(unexpected(t, s)),
            }
        }
    }

    /// The hello and its answer: the version, the key (both sides have one
    /// or neither), room for one more connection. The hello is not
    /// authenticated itself, but both nonces go into every tag after it.
    fn greet<R: Read, W: Write>(
        &self,
        c: &mut Conn<R, W>,
        busy: bool,
    ) -> std::result::Result<(), Stop> {
        let mut hello = [0u8; HELLO_LEN];
        c.get(&mut hello[..12])?;
        let version_ok = le_u32(&hello, 0) == MAGIC && le_u32(&hello, 4) == VERSION;
        if version_ok {
            c.get(&mut hello[12..])?;
        }
        let flags = le_u32(&hello, 8);
        let keys_agree = (flags & FLAG_AUTH != 0) == self.key.is_some();
        // Without a key, only this user's own processes may send (a
        // snapshot names a process and its memory: another user's would be
        // restored as if it were one of this user's).
        let foreign = self.key.is_none() && c.foreign_user.is_some();
        let status = if !version_ok {
            libc::EPROTO
        } else if !keys_agree || foreign {
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
        // What the store holds is told to no peer before it is known: with
        // a key, to none at all here.
        let have = if status == 0 && self.key.is_none() {
            self.store().ids().map_err(Stop::Local)?.len() as u64
        } else {
            0
        };
        reply.extend_from_slice(&have.to_le_bytes());
        if status == 0 {
            reply.extend_from_slice(&mine);
        }
        c.out.write_all(&reply).map_err(|e| c.broken(e))?;
        c.out.flush().map_err(|e| c.broken(e))?;
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
                return Err(Stop::Broken(
                    if let (true, Some(u)) = (foreign, c.foreign_user) {
                        format!(
                            "refused: the sender runs as uid {u}; a receiver without a key takes \
                         snapshots from its own user (uid {}) only: give both ends --key",
                            pagewise_sys::process::geteuid()
                        )
                    } else if self.key.is_some() {
                        "refused: the sender has no key (this receiver needs --key)".into()
                    } else {
                        "refused: the sender authenticates with a key this receiver lacks".into()
                    },
                ))
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
        Ok(())
    }

    /// The regions of the snapshot being copied: within the cap, not
    /// overlapping; those already held keep their bytes.
    fn regions<R: Read, W: Write>(
        &self,
        c: &mut Conn<R, W>,
        m: &mut Mirror,
    ) -> std::result::Result<(), Stop> {
        let mut n = [0u8; 4];
        c.get(&mut n)?;
        let n = u32::from_le_bytes(n);
        if n > MAX_REGIONS {
            return Err(Stop::Refuse(format!(
                "{n} regions, more than {MAX_REGIONS}"
            )));
        }
        let mut b = vec![0u8; n as usize * 16];
        c.get(&mut b)?;
        c.checked()?;
        let mut now = Vec::with_capacity(n as usize);
        let mut total = 0u64;
        for i in 0..n as usize {
            let r = Region::new(le_u64(&b, i * 16), le_u64(&b, i * 16 + 8))
                .map_err(|e| Stop::Refuse(format!("region {i}: {e}")))?;
            total = total.saturating_add(r.len);
            now.push(r);
        }
        // Counted in what every connection's copy holds, this one's at its
        // new size, before any of it is allocated.
        let was = c.held;
        let held = self
            .holding
            .fetch_update(
                std::sync::atomic::Ordering::SeqCst,
                std::sync::atomic::Ordering::SeqCst,
                |all| {
                    let now = all.saturating_sub(was).saturating_add(total);
                    (now <= self.max_bytes).then_some(now)
                },
            )
            .map_err(|all| {
                Stop::Refuse(format!(
                    "regions of {total} bytes, more than this receiver holds ({} bytes, {} of \
                     them held by other connections)",
                    self.max_bytes,
                    all.saturating_sub(was)
                ))
            });
        held?;
        c.held = total;
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
        Ok(())
    }

    /// The snapshot's pid and label, then the copy saved into the store
    /// (only the pages sent in it written anew) and the save reported to
    /// the sender; the copy, kept for the next snapshot.
    fn finish<R: Read, W: Write>(
        &self,
        c: &mut Conn<R, W>,
        mut m: Mirror,
        got: &mut Received,
        events: &mut dyn FnMut(Event<'_>),
    ) -> std::result::Result<Mirror, Stop> {
        let mut h = [0u8; 12];
        c.get(&mut h)?;
        let (pid, len) = (le_u64(&h, 0) as i64, le_u32(&h, 8));
        if len > MAX_LABEL {
            return Err(Stop::Refuse(format!("a label of {len} bytes")));
        }
        let mut label = vec![0u8; len as usize];
        c.get(&mut label)?;
        c.checked()?;
        let label = String::from_utf8(label)
            .map_err(|_| Stop::Refuse("a label that is not UTF-8".into()))?;
        let pid = i32::try_from(pid).ok().filter(|p| *p > 0);
        // Pages not sent in this snapshot are those of the last.
        pagewise_mech::region::normalize(&mut m.changed);
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
        c.put(&b)?;
        Ok(m)
    }
}

/// One chunk of pages into the copy: its header checked, its payload
/// decoded straight into the region it names, every page's digest checked;
/// how many pages it held.
fn pages<R: Read, W: Write>(
    c: &mut Conn<R, W>,
    m: &mut Mirror,
    payload: &mut Vec<u8>,
) -> std::result::Result<u64, Stop> {
    let mut h = [0u8; 23];
    c.get(&mut h)?;
    let (enc, pages, addr, plen) = (h[0], le_u32(&h, 3), le_u64(&h, 7), le_u32(&h, 15) as usize);
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
    c.get(&mut digests)?;
    payload.resize(plen, 0);
    c.get(payload)?;
    c.checked()?;
    if addr % PAGE_SIZE as u64 != 0 {
        return Err(Stop::Refuse(format!("pages at unaligned {addr:#x}")));
    }
    let nowhere = || Stop::Refuse(format!("pages at {addr:#x}+{pages} lie in no region"));
    let (off, buf) = m
        .regions
        .iter_mut()
        .find_map(|(r, buf)| Some((r.offset_of(addr, bytes as u64)?, buf)))
        .ok_or_else(nowhere)?;
    let dst = buf.get_mut(off..off + bytes).ok_or_else(nowhere)?;
    match enc {
        ENC_RAW => dst.copy_from_slice(payload),
        // Only pages not zero already are written: a copy's pages start as
        // zeros the kernel has not committed, and stay so.
        ENC_ZERO => {
            for p in dst.chunks_exact_mut(PAGE_SIZE) {
                if p.iter().any(|&b| b != 0) {
                    p.fill(0);
                }
            }
        }
        _ => {
            // Straight into the copy: a chunk that fails is refused and the
            // copy dropped with it.
            let n = lz4_flex::block::decompress_into(payload, dst)
                .map_err(|e| Stop::Refuse(format!("LZ4 chunk at {addr:#x}: {e}")))?;
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
    pagewise_mech::region::push_coalesced(&mut m.changed, addr, addr + bytes as u64);
    Ok(u64::from(pages))
}

/// A message the receiver does not take in its state.
fn unexpected(t: u8, s: &State) -> Stop {
    let in_state = match s {
        State::Greeting => "greeting",
        State::Idle => "idle",
        State::Copying(_) => "copying",
        State::Complete(_) => "complete",
    };
    Stop::Refuse(format!(
        "message {:?} ({t:#04x}) where the receiver is {in_state}",
        t as char
    ))
}

fn refuse(out: &mut impl Write, why: &str) -> io::Result<()> {
    let text = &why.as_bytes()[..why.len().min(MAX_REASON as usize)];
    out.write_all(&[MSG_ERROR])?;
    out.write_all(&(text.len() as u32).to_le_bytes())?;
    out.write_all(text)?;
    out.flush()
}
