//! The page server CRIU dumps into, against sessions written as CRIU's
//! `page-xfer.c` writes them, in both headers: every page sent is the
//! page stored at its address, a dump of pages already stored adds no
//! byte, and a peer that breaks the protocol is said and stores nothing
//! of the broken pagemap; the next session is served as before.

use super::disk::TempDir;
use pagewise::PAGE_SIZE;
use pagewise_snap::criu::wire::{self, Dialect, Header, Pagemap};
use pagewise_snap::criu::{PageServer, Received};
use pagewise_snap::DiskStore;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};

/// One run of a pagemap: its address, pages, flags and, per page, the
/// byte it is filled with (present runs only).
struct Run {
    vaddr: u64,
    nr: u64,
    flags: u32,
    fill: u8,
}

fn page(fill: u8, i: u64) -> Vec<u8> {
    let mut p = vec![fill; PAGE_SIZE];
    p[..8].copy_from_slice(&i.to_le_bytes());
    p
}

/// A whole dump as CRIU sends it: per pagemap OPEN2 then its runs (ADD_F,
/// the bytes of present ones after their header), then CLOSE.
fn dump(d: Dialect, pagemaps: &[(u64, Vec<Run>)]) -> Vec<u8> {
    let mut m = Vec::new();
    let h = |op, flags, nr_pages, vaddr, dst_id| Header {
        op,
        flags,
        nr_pages,
        vaddr,
        dst_id,
    };
    for (dst, runs) in pagemaps {
        m.extend(h(wire::OP_OPEN2, 0, 0, 0, *dst).encode(d));
        for r in runs {
            m.extend(h(wire::OP_ADD_F, r.flags, r.nr, r.vaddr, *dst).encode(d));
            if r.flags & wire::PE_PRESENT != 0 {
                for i in 0..r.nr {
                    m.extend(page(r.fill, r.vaddr / PAGE_SIZE as u64 + i));
                }
            }
        }
    }
    m.extend(h(wire::OP_CLOSE, 0, 0, 0, 0).encode(d));
    m
}

/// Serves one session of `bytes` on loopback; what the server heard and
/// what it answered.
fn serve(server: &mut PageServer, bytes: Vec<u8>) -> (Received, Vec<u8>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(&bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        answer
    });
    let (s, _) = l.accept().unwrap();
    let got = server.serve(s).expect("the store's own calls succeed");
    (got, peer.join().unwrap())
}

fn task(pid: u64) -> u64 {
    pid << 8 | 1
}

fn sample() -> Vec<(u64, Vec<Run>)> {
    let r = |vaddr, nr, flags, fill| Run {
        vaddr,
        nr,
        flags,
        fill,
    };
    let present = wire::PE_PRESENT;
    let lazy = wire::PE_PRESENT | wire::PE_LAZY;
    vec![
        (
            task(4242),
            vec![
                r(0x5555_0000_0000, 3, present, 1),
                r(0x5555_0000_3000, 2, lazy, 2),
                r(0x5555_0001_0000, 4, wire::PE_PARENT, 0),
                r(0x7fff_f000_0000, 5, lazy, 3),
            ],
        ),
        (7 << 8 | 2, vec![r(0, 2, present, 4)]),
    ]
}

#[test]
fn each_header_stores_every_page_sent_at_its_address() {
    for d in [Dialect::V42, Dialect::Legacy] {
        let dir = TempDir::new("criu-dialect");
        let mut server = PageServer::new(DiskStore::create(&dir.0, true).unwrap());
        let (got, answer) = serve(&mut server, dump(d, &sample()));
        assert_eq!(got.broken, None, "{d:?}");
        assert!(got.closed && got.dialect == Some(d) && got.dump == Some(1));
        // One byte (no parent) per OPEN2, then CLOSE's zero status.
        assert_eq!(answer, [0u8, 0, 0, 0, 0, 0], "{d:?}");
        assert_eq!(got.present_pages, 3 + 2 + 5 + 2);
        let kinds: Vec<_> = got.pagemaps.iter().map(|p| (p.kind, p.id)).collect();
        assert_eq!(kinds, [(Pagemap::Task, 4242), (Pagemap::Shmem, 7)]);
        let store = server.store();
        for (pm, (_, runs)) in got.pagemaps.iter().zip(sample()) {
            assert_eq!(pm.runs.len(), runs.len(), "every run kept in the pagemap");
            let snap = store.load(pm.snapshot).unwrap();
            let mut want = Vec::new();
            for r in runs.iter().filter(|r| r.flags & wire::PE_PRESENT != 0) {
                for i in 0..r.nr {
                    let at = r.vaddr + i * PAGE_SIZE as u64;
                    want.push((at, page(r.fill, at / PAGE_SIZE as u64)));
                }
            }
            assert_eq!(snap.pages(), want.len() as u64, "{d:?}: pages of {}", pm.id);
            let mut buf = vec![0u8; PAGE_SIZE];
            for (i, (at, bytes)) in want.iter().enumerate() {
                assert_eq!(snap.address_of(i as u64), Some(*at));
                store.read_page(snap.entries[i], &mut buf).unwrap();
                assert!(buf == *bytes, "{d:?}: the page at {at:#x} differs");
            }
        }
        let record = dir.0.join("criu/dump-1.json");
        let rec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
        assert_eq!(rec["closed"], true);
        assert_eq!(rec["pagemaps"][0]["runs"][2]["flags"], wire::PE_PARENT);
    }
}

#[test]
fn a_dump_of_pages_already_stored_adds_no_byte() {
    let dir = TempDir::new("criu-again");
    let mut server = PageServer::new(DiskStore::create(&dir.0, true).unwrap());
    let (first, _) = serve(&mut server, dump(Dialect::V42, &sample()));
    assert!(first.stored_bytes > 0);
    let (second, _) = serve(&mut server, dump(Dialect::V42, &sample()));
    assert_eq!(second.broken, None);
    assert_eq!(second.dump, Some(2));
    assert_eq!(
        second.stored_bytes, 0,
        "every page of the second dump is one the store holds"
    );
}

#[test]
fn a_peer_that_breaks_the_protocol_is_said_and_the_next_is_served() {
    let d = Dialect::V42;
    let h = |op, flags, nr_pages, vaddr| {
        Header {
            op,
            flags,
            nr_pages,
            vaddr,
            dst_id: task(9),
        }
        .encode(d)
    };
    let open = h(wire::OP_OPEN2, 0, 0, 0);
    let with = |rest: Vec<u8>| [open.clone(), rest].concat();
    let present = wire::PE_PRESENT;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("half a header", open[..10].to_vec(), "half a header"),
        ("unknown command", with(h(99, 0, 0, 0)), "unknown command"),
        (
            "unaligned run",
            with(h(wire::OP_ADD_F, present, 1, 0x1001)),
            "not page-aligned",
        ),
        (
            "run of no page",
            with(h(wire::OP_ADD_F, present, 0, 0x1000)),
            "no page",
        ),
        (
            "past user space",
            with(h(wire::OP_ADD_F, present, 2, (1 << 56) - 0x1000)),
            "past the user address space",
        ),
        (
            "address overflow",
            with(h(wire::OP_ADD_F, present, u64::MAX / 2, 0x1000)),
            "more than",
        ),
        (
            "unknown flags",
            with(h(wire::OP_ADD_F, 0x80, 1, 0x1000)),
            "unknown page flags",
        ),
        (
            "pages cut short",
            with([h(wire::OP_ADD_F, present, 3, 0x1000), vec![1u8; 5000]].concat()),
            "closed the connection",
        ),
        (
            "no CLOSE",
            with([h(wire::OP_ADD_F, present, 1, 0x1000), vec![1u8; 4096]].concat()),
            "before CLOSE",
        ),
        (
            "out of order",
            with(
                [
                    h(wire::OP_ADD_F, present, 1, 0x3000),
                    vec![1u8; 4096],
                    h(wire::OP_ADD_F, present, 1, 0x1000),
                    vec![1u8; 4096],
                ]
                .concat(),
            ),
            "address order",
        ),
        (
            "unknown pagemap type",
            Header {
                op: wire::OP_OPEN2,
                flags: 0,
                nr_pages: 0,
                vaddr: 0,
                dst_id: 9 << 8 | 5,
            }
            .encode(d),
            "unknown pagemap type",
        ),
        ("lazy request", h(wire::OP_GET, 0, 1, 0x1000), "GET"),
    ];
    let dir = TempDir::new("criu-hostile");
    let mut server = PageServer::new(DiskStore::create(&dir.0, true).unwrap());
    for (name, bytes, said) in cases {
        let (got, _) = serve(&mut server, bytes);
        let why = got.broken.unwrap_or_else(|| panic!("{name}: not refused"));
        assert!(why.contains(said), "{name}: said {why:?}, want {said:?}");
        assert!(!got.closed, "{name}");
        assert_eq!(got.present_pages, 0, "{name}: no pagemap completed");
    }
    // The store is whole, and the next dump is served as any: the pages
    // the broken sessions sent were given up, not kept (its pack is that
    // of a store that only ever heard the good dump).
    let (got, _) = serve(&mut server, dump(d, &sample()));
    assert_eq!(got.broken, None);
    assert_eq!(got.present_pages, 12);
    let fresh = TempDir::new("criu-fresh");
    let mut clean = PageServer::new(DiskStore::create(&fresh.0, true).unwrap());
    serve(&mut clean, dump(d, &sample()));
    assert_eq!(
        server.store().stats().unwrap().pack_bytes,
        clean.store().stats().unwrap().pack_bytes,
        "the broken sessions' pages are not kept"
    );
    drop(server);
    DiskStore::open(&dir.0).expect("the store opens after every broken session");
}

#[test]
fn lazy_requests_are_answered_with_the_kept_pages_and_only_lazy_ones() {
    let d = Dialect::V42;
    let dir = TempDir::new("criu-lazy");
    let mut keeper = PageServer::new(DiskStore::create(&dir.0, true).unwrap());
    serve(&mut keeper, dump(d, &sample()));
    drop(keeper);
    let mut server = PageServer::new(DiskStore::open(&dir.0).unwrap());
    server.serve_lazy(1).unwrap();
    let get = |nr_pages, vaddr, dst_id| {
        Header {
            op: wire::OP_GET,
            flags: 0,
            nr_pages,
            vaddr,
            dst_id,
        }
        .encode(d)
    };
    let close = Header {
        op: wire::OP_CLOSE,
        flags: 0,
        nr_pages: 0,
        vaddr: 0,
        dst_id: 0,
    }
    .encode(d);
    // Two pages asked of a lazy run of two (5 asked: the run's 2 sent),
    // then the last two of the five-page run at the stack's end.
    let session = [
        get(5, 0x5555_0000_3000, 4242),
        get(2, 0x7fff_f000_3000, 4242),
        close,
    ]
    .concat();
    let (got, answer) = serve(&mut server, session);
    assert_eq!(got.broken, None);
    assert!(got.closed);
    assert_eq!((got.requests, got.served_pages), (2, 4));
    let mut want = Vec::new();
    for (nr, vaddr, fill) in [(2u64, 0x5555_0000_3000u64, 2u8), (2, 0x7fff_f000_3000, 3)] {
        let reply = Header {
            op: wire::OP_ADD_F,
            flags: wire::PE_PRESENT,
            nr_pages: nr,
            vaddr,
            dst_id: 4242,
        };
        want.extend(reply.encode(d));
        for i in 0..nr {
            want.extend(page(fill, vaddr / PAGE_SIZE as u64 + i));
        }
    }
    want.extend([0u8; 4]);
    assert!(
        answer == want,
        "the answers are the kept pages, as CRIU reads them"
    );
    // A page the dump did not mark lazy, another task, a page not kept.
    for (name, req, said) in [
        (
            "present, not lazy",
            get(1, 0x5555_0000_0000, 4242),
            "no lazy page",
        ),
        (
            "in the parent",
            get(1, 0x5555_0001_0000, 4242),
            "no lazy page",
        ),
        ("another task", get(1, 0x5555_0000_3000, 99), "task 99"),
        // (After a first request: an unaligned first one reads as the
        // older header, and is refused as such.)
        (
            "unaligned",
            [
                get(1, 0x5555_0000_3000, 4242),
                get(1, 0x5555_0000_3008, 4242),
            ]
            .concat(),
            "no lazy page",
        ),
        (
            "a dump to a lazy server",
            dump(d, &sample()),
            "takes GET and CLOSE",
        ),
    ] {
        let (got, _) = serve(&mut server, req);
        let why = got.broken.unwrap_or_else(|| panic!("{name}: not refused"));
        assert!(why.contains(said), "{name}: said {why:?}");
    }
}
