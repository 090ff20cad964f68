//! The real servers tests and experiments start on loopback, Redis and
//! Memcached: a free port, the arguments that keep them on loopback and off
//! the disk, a bounded wait for them to listen, and clients of our own that
//! store distinct values and read them back byte for byte.
//!
//! ```no_run
//! use pagewise_testkit::servers::{fill, free_port, redis_args, verify, wait_ready_within, Kv};
//! # fn main() -> std::io::Result<()> {
//! let port = free_port()?;
//! let mut server = std::process::Command::new("redis-server").args(redis_args(port)).spawn()?;
//! wait_ready_within(port, std::time::Duration::from_secs(10))?;
//! fill(Kv::Redis, port, 1000, 64)?;
//! assert_eq!(verify(Kv::Redis, port, 1000, 64, 1000)?, 1000);
//! server.kill()?;
//! # Ok(())
//! # }
//! ```

use std::io::{self, BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

/// A TCP port free on loopback now.
pub fn free_port() -> io::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Waits, `within` at most, until something listens on 127.0.0.1:`port`;
/// a server that does not is an error that says so.
pub fn wait_ready_within(port: u16, within: Duration) -> io::Result<()> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Err(io::Error::new(
        io::ErrorKind::TimedOut,
        format!(
            "the server did not listen on 127.0.0.1:{port} within {} s",
            within.as_secs()
        ),
    ))
}

/// The arguments of a `redis-server` that listens on loopback at `port` and
/// writes nothing to disk.
pub fn redis_args(port: u16) -> Vec<String> {
    let dir = std::env::temp_dir();
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        dir.to_str().unwrap_or("/tmp"),
    ]
    .map(String::from)
    .to_vec()
}

/// The arguments of a `memcached` on loopback at `port` (TCP only, 1 GiB,
/// 4 threads, `shutdown` allowed), told to run as root when it is root.
pub fn memcached_args(port: u16) -> Vec<String> {
    let mut a: Vec<String> = [
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        "1024",
        "-t",
        "4",
        "-A",
    ]
    .map(String::from)
    .to_vec();
    if crate::is_root() {
        // memcached refuses to run as root unless told whom to be.
        a.extend(["-u".to_string(), "root".to_string()]);
    }
    a
}

/// The name of key number `i`: `key:%012d`, the names `redis-benchmark -r`
/// asks for.
pub fn key(i: u64) -> String {
    format!("key:{i:012}")
}

/// The value of key number `i`: `len` bytes of its own.
pub fn value(i: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(format!("{x:016x}").as_bytes());
    }
    v.truncate(len);
    v
}

/// Appends a RESP bulk string.
pub fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// Reads one RESP reply: `Some(bytes)` for a bulk string, `None` for nil;
/// simple strings and integers come back as their text, an error reply is
/// an error.
pub fn reply(r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    match line.as_bytes().first() {
        Some(b'+' | b':') => Ok(Some(line[1..].trim_end().as_bytes().to_vec())),
        Some(b'-') => Err(bad(format!(
            "redis answered an error: {}",
            line[1..].trim_end()
        ))),
        Some(b'$') => {
            let n: i64 = line[1..]
                .trim_end()
                .parse()
                .map_err(|_| bad(format!("a bulk length that is no number: {line:?}")))?;
            if n < 0 {
                return Ok(None);
            }
            let mut b = vec![0u8; n as usize + 2];
            r.read_exact(&mut b)?;
            b.truncate(n as usize);
            Ok(Some(b))
        }
        _ => Err(bad(format!("unexpected reply from redis: {line:?}"))),
    }
}

/// A Redis client of one connection that sends commands in batches.
pub struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    /// Connects to the server on loopback port `port`.
    pub fn connect(port: u16) -> io::Result<Client> {
        let s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("connecting to redis on 127.0.0.1:{port}: {e}"),
            )
        })?;
        Ok(Client {
            w: s.try_clone()?,
            r: BufReader::new(s),
        })
    }

    /// Bounds every read and write of this client: an answer that does not
    /// come within `d` is an error, never a wait for ever.
    pub fn timeout(&self, d: Duration) -> io::Result<()> {
        self.w.set_write_timeout(Some(d))?;
        self.r.get_ref().set_read_timeout(Some(d))?;
        Ok(())
    }

    /// Sends every command at once, then reads their replies in order.
    pub fn pipeline(&mut self, cmds: &[Vec<&[u8]>]) -> io::Result<Vec<Option<Vec<u8>>>> {
        let mut buf = Vec::new();
        for c in cmds {
            buf.extend_from_slice(format!("*{}\r\n", c.len()).as_bytes());
            for a in c {
                bulk(&mut buf, a);
            }
        }
        self.w.write_all(&buf)?;
        cmds.iter().map(|_| reply(&mut self.r)).collect()
    }
}

/// A key-value server spoken to by [`fill`] and [`verify`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Kv {
    /// `redis-server`, spoken to in RESP.
    Redis,
    /// `memcached`, spoken to in its text protocol.
    Memcached,
}

impl Kv {
    /// Its name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Kv::Redis => "redis",
            Kv::Memcached => "memcached",
        }
    }

    /// Appends a request storing key `k` with its value.
    pub fn put(self, buf: &mut Vec<u8>, k: u64, len: usize) {
        match self {
            Kv::Redis => {
                buf.extend_from_slice(b"*3\r\n");
                bulk(buf, b"SET");
                bulk(buf, key(k).as_bytes());
                bulk(buf, &value(k, len));
            }
            Kv::Memcached => {
                buf.extend_from_slice(format!("set {} 0 0 {len}\r\n", key(k)).as_bytes());
                buf.extend_from_slice(&value(k, len));
                buf.extend_from_slice(b"\r\n");
            }
        }
    }

    /// Reads the answer to one [`Kv::put`].
    pub fn stored(self, r: &mut impl BufRead) -> io::Result<()> {
        match self {
            Kv::Redis => {
                if reply(r)?.as_deref() != Some(b"OK") {
                    return Err(bad("SET failed".into()));
                }
            }
            Kv::Memcached => {
                let mut line = String::new();
                r.read_line(&mut line)?;
                if line != "STORED\r\n" {
                    return Err(bad(format!("memcached answered {line:?} to a set")));
                }
            }
        }
        Ok(())
    }

    /// Appends a request reading key `k`.
    pub fn get(self, buf: &mut Vec<u8>, k: u64) {
        match self {
            Kv::Redis => {
                buf.extend_from_slice(b"*2\r\n");
                bulk(buf, b"GET");
                bulk(buf, key(k).as_bytes());
            }
            Kv::Memcached => buf.extend_from_slice(format!("get {}\r\n", key(k)).as_bytes()),
        }
    }

    /// Reads the answer to one [`Kv::get`]: the value, `None` when the
    /// key is missing.
    pub fn got(self, r: &mut impl BufRead) -> io::Result<Option<Vec<u8>>> {
        if self == Kv::Redis {
            return reply(r);
        }
        let mut line = String::new();
        r.read_line(&mut line)?;
        if line == "END\r\n" {
            return Ok(None);
        }
        let n: usize = line
            .split_whitespace()
            .nth(3)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(format!("memcached answered {line:?} to a get")))?;
        let mut v = vec![0u8; n + 2];
        r.read_exact(&mut v)?;
        v.truncate(n);
        line.clear();
        r.read_line(&mut line)?;
        if line != "END\r\n" {
            return Err(bad(format!("memcached answered {line:?} after a value")));
        }
        Ok(Some(v))
    }
}

/// Stores keys `0..keys` with their values, pipelined in batches.
pub fn fill(kv: Kv, port: u16, keys: u64, len: usize) -> io::Result<()> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let mut i = 0;
    while i < keys {
        let n = (keys - i).min(256);
        let mut buf = Vec::new();
        for k in i..i + n {
            kv.put(&mut buf, k, len);
        }
        w.write_all(&buf)?;
        for _ in 0..n {
            kv.stored(&mut r)?;
        }
        i += n;
    }
    Ok(())
}

/// Reads back every `keys/samples`-th key: all must hold their value (a
/// wrong or missing one is an error that names it); the number read.
pub fn verify(kv: Kv, port: u16, keys: u64, len: usize, samples: u64) -> io::Result<u64> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    let mut w = s.try_clone()?;
    let mut r = BufReader::new(s);
    let step = (keys / samples).max(1);
    let mut checked = 0;
    let mut k = 0;
    while k < keys {
        let mut buf = Vec::new();
        kv.get(&mut buf, k);
        w.write_all(&buf)?;
        match kv.got(&mut r)? {
            Some(v) if v == value(k, len) => checked += 1,
            Some(_) => {
                return Err(bad(format!(
                    "{} returned a wrong value for {}",
                    kv.name(),
                    key(k)
                )))
            }
            None => return Err(bad(format!("{} lost {}", kv.name(), key(k)))),
        }
        k += step;
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_replies_are_read_as_redis_writes_them() {
        let mut r = &b"+OK\r\n:42\r\n$3\r\nabc\r\n$-1\r\n-ERR no\r\n"[..];
        assert_eq!(reply(&mut r).unwrap().as_deref(), Some(&b"OK"[..]));
        assert_eq!(reply(&mut r).unwrap().as_deref(), Some(&b"42"[..]));
        assert_eq!(reply(&mut r).unwrap().as_deref(), Some(&b"abc"[..]));
        assert_eq!(reply(&mut r).unwrap(), None);
        let e = reply(&mut r).unwrap_err();
        assert!(e.to_string().contains("ERR no"), "{e}");
    }

    #[test]
    fn memcached_answers_are_read_as_it_writes_them() {
        let v = value(7, 5);
        let mut text = b"VALUE key:000000000007 0 5\r\n".to_vec();
        text.extend_from_slice(&v);
        text.extend_from_slice(b"\r\nEND\r\nEND\r\nSTORED\r\n");
        let mut r = &text[..];
        assert_eq!(Kv::Memcached.got(&mut r).unwrap(), Some(v));
        assert_eq!(Kv::Memcached.got(&mut r).unwrap(), None);
        Kv::Memcached.stored(&mut r).unwrap();
    }

    #[test]
    fn values_differ_by_key_and_have_their_length() {
        assert_eq!(value(1, 100).len(), 100);
        assert_ne!(value(1, 64), value(2, 64));
        assert_eq!(value(3, 64), value(3, 64));
    }
}
