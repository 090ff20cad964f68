//! CRIU's page-server protocol: a whole dump session from a peer, served
//! over loopback to a page server that stores what it is sent.

use anyhow::Result;
use pagewise_mech::PAGE_SIZE;
use pagewise_snap::criu::wire::{self, Dialect, Header};
use pagewise_snap::criu::PageServer;
use pagewise_snap::DiskStore;
use std::net::TcpListener;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use super::{over_loopback, Target};
use crate::mutate::Rng;

/// A page server and the loopback socket it is sent on.
pub(super) struct CriuPageServer {
    server: Mutex<PageServer>,
    listener: TcpListener,
}

impl CriuPageServer {
    pub(super) fn new(work: &Path) -> Result<CriuPageServer> {
        let dir = work.join("criu-store");
        let _ = std::fs::remove_dir_all(&dir);
        let mut server = PageServer::new(DiskStore::create(&dir, true)?);
        server.idle = Duration::from_secs(5);
        // Bounded as any peer is, lower: a fuzzer's pages land on disk.
        server.max_pages = 4096;
        let listener = TcpListener::bind("127.0.0.1:0")?;
        Ok(CriuPageServer {
            server: Mutex::new(server),
            listener,
        })
    }
}

impl Target for CriuPageServer {
    fn feed(&self, input: &[u8]) -> bool {
        // Store errors are the server's own (a full disk); the peer's
        // faults are results. Only a panic is a failure.
        over_loopback(&self.listener, input, |s| {
            let mut server = self.server.lock().unwrap_or_else(|e| e.into_inner());
            server
                .serve(s)
                .is_ok_and(|r| r.broken.is_none() && r.closed && r.present_pages > 0)
        })
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..8)
            .map(|i| {
                let d = if i % 2 == 0 {
                    Dialect::V42
                } else {
                    Dialect::Legacy
                };
                session(rng, d)
            })
            .collect()
    }
}

/// A whole dump, valid, as CRIU writes it: a task's pagemap opened, a few
/// runs (present, lazy, in the parent), then closed.
pub(super) fn session(rng: &mut Rng, d: Dialect) -> Vec<u8> {
    let dst = (1000 + rng.below(1000) as u64) << 8 | 1;
    let h = |op, flags, nr_pages, vaddr| {
        Header {
            op,
            flags,
            nr_pages,
            vaddr,
            dst_id: dst,
        }
        .encode(d)
    };
    let mut m = h(wire::OP_OPEN2, 0, 0, 0);
    let mut vaddr = 0x5555_0000_0000u64;
    for _ in 0..1 + rng.below(4) {
        let nr = 1 + rng.below(3) as u64;
        let flags = match rng.below(3) {
            0 => wire::PE_PRESENT,
            1 => wire::PE_PRESENT | wire::PE_LAZY,
            _ => wire::PE_PARENT,
        };
        m.extend(h(wire::OP_ADD_F, flags, nr, vaddr));
        if flags & wire::PE_PRESENT != 0 {
            for _ in 0..nr {
                m.extend(vec![rng.word() as u8; PAGE_SIZE]);
            }
        }
        vaddr += (nr + rng.below(4) as u64) * PAGE_SIZE as u64;
    }
    // At least one present page: a seed is read as a dump that stored one.
    m.extend(h(wire::OP_ADD_F, wire::PE_PRESENT, 1, vaddr));
    m.extend(vec![0x5a; PAGE_SIZE]);
    m.extend(h(wire::OP_CLOSE, 0, 0, 0));
    m
}
