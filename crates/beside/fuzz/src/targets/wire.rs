//! The migration wire protocol: a whole session from a sender, served over
//! loopback to a receiver that stores what it is sent.

use anyhow::Result;
use pagewise_mech::PAGE_SIZE;
use pagewise_snap::wire::{Receiver, MAGIC, NONCE_LEN, VERSION};
use pagewise_snap::DiskStore;
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use super::{le, over_loopback, Target};
use crate::mutate::Rng;

/// A receiver and the loopback socket it is sent on.
pub(super) struct Wire {
    rx: Receiver,
    listener: TcpListener,
}

impl Wire {
    pub(super) fn new(work: &Path) -> Result<Wire> {
        let dir = work.join("wire-store");
        let _ = std::fs::remove_dir_all(&dir);
        let mut rx = Receiver::new(DiskStore::create(&dir, true)?);
        rx.idle = Duration::from_secs(5);
        rx.max_bytes = 64 << 20;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        Ok(Wire { rx, listener })
    }
}

impl Target for Wire {
    fn feed(&self, input: &[u8]) -> bool {
        // Store errors are the receiver's own (a full disk); the peer's
        // faults are results. Only a panic is a failure.
        over_loopback(&self.listener, input, |s| {
            self.rx
                .serve(s, &mut |_| {})
                .is_ok_and(|r| r.broken.is_none() && !r.saved.is_empty())
        })
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..8).map(|_| session(rng)).collect()
    }
}

/// A whole migration session, valid, as a sender writes it (no key).
pub(super) fn session(rng: &mut Rng) -> Vec<u8> {
    let mut m = Vec::new();
    for v in [MAGIC, VERSION, 1] {
        m.extend_from_slice(&v.to_le_bytes());
    }
    m.extend_from_slice(&[9u8; NONCE_LEN]);
    m.push(b'B');
    let base = 0x10000u64;
    let pages = 1 + rng.below(4) as u64;
    m.push(b'R');
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&le(&[base, pages * PAGE_SIZE as u64]));
    for p in 0..pages {
        let fill = rng.word() as u8;
        let page = vec![fill; PAGE_SIZE];
        let (enc, payload): (u8, Vec<u8>) = match rng.below(3) {
            0 => (0, page.clone()),
            1 => (1, lz4_block(&page)),
            _ => (2, Vec::new()),
        };
        let page = if enc == 2 { vec![0u8; PAGE_SIZE] } else { page };
        let mut h = [0u8; 24];
        h[0] = b'P';
        h[1] = enc;
        h[4..8].copy_from_slice(&1u32.to_le_bytes());
        h[8..16].copy_from_slice(&(base + p * PAGE_SIZE as u64).to_le_bytes());
        h[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        m.extend_from_slice(&h);
        m.extend_from_slice(&pagewise_mech::hash::page_hash(&page).to_le_bytes());
        m.extend_from_slice(&payload);
    }
    m.push(b'E');
    m.extend_from_slice(&0u32.to_le_bytes());
    m.push(b'D');
    m.push(b'F');
    m.extend_from_slice(&7i64.to_le_bytes());
    m.extend_from_slice(&2u32.to_le_bytes());
    m.extend_from_slice(b"fz");
    m.push(b'Q');
    m
}

/// The pages of a page as one LZ4 block, as the sender makes it: a
/// literal-only block is valid LZ4 and needs no compressor here.
fn lz4_block(page: &[u8]) -> Vec<u8> {
    // One sequence: token 0xF0 (15+ literals, no match), the literal
    // length's extension bytes, the literals.
    let mut out = vec![0xf0u8];
    let mut n = page.len() - 15;
    while n >= 255 {
        out.push(255);
        n -= 255;
    }
    out.push(n as u8);
    out.extend_from_slice(page);
    out
}
