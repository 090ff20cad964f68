//! A connection's authentication (see the module docs of [`super`]):
//! HMAC-SHA256 over both nonces, the direction and the sequence of every
//! message.

use super::{Key, NONCE_LEN, TAG_LEN};
use crate::{Error, Result};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// One connection's authentication (see the module): a running tag for
/// the message being sent and the one being read.
pub(super) struct Auth {
    session: [u8; 32],
    /// Direction bytes: this side's, the peer's.
    dirs: (u8, u8),
    seq: (u64, u64),
    tx: Option<HmacSha256>,
    rx: Option<HmacSha256>,
}

impl Auth {
    pub(super) fn new(key: &Key, sender_nonce: &[u8], receiver_nonce: &[u8], sender: bool) -> Auth {
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

    pub(super) fn start(&self, dir: u8, seq: u64) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.session).expect("32 bytes");
        m.update(&[dir]);
        m.update(&seq.to_le_bytes());
        m
    }

    pub(super) fn sent(&mut self, b: &[u8]) {
        if self.tx.is_none() {
            self.tx = Some(self.start(self.dirs.0, self.seq.0));
        }
        self.tx.as_mut().expect("set").update(b);
    }

    /// The tag of the message sent since the last one.
    pub(super) fn end_sent(&mut self) -> [u8; TAG_LEN] {
        let m = self
            .tx
            .take()
            .unwrap_or_else(|| self.start(self.dirs.0, self.seq.0));
        self.seq.0 += 1;
        let mut t = [0u8; TAG_LEN];
        t.copy_from_slice(&m.finalize().into_bytes());
        t
    }

    pub(super) fn read(&mut self, b: &[u8]) {
        if self.rx.is_none() {
            self.rx = Some(self.start(self.dirs.1, self.seq.1));
        }
        self.rx.as_mut().expect("set").update(b);
    }

    /// Whether `tag` is that of the message read since the last one.
    pub(super) fn check_read(&mut self, tag: &[u8]) -> bool {
        let m = self
            .rx
            .take()
            .unwrap_or_else(|| self.start(self.dirs.1, self.seq.1));
        self.seq.1 += 1;
        m.verify_slice(tag).is_ok()
    }
}

/// A fresh nonce.
pub(super) fn nonce() -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    let got = pagewise_sys::process::getrandom(&mut n).map_err(|e| Error::os("getrandom", e))?;
    if got != NONCE_LEN {
        return Err(Error::Internal {
            what: "getrandom returned a short nonce",
        });
    }
    Ok(n)
}
