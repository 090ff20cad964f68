//! Migration over loopback against ground truth: what the receiver saves is
//! the process's memory at the stop, page for page, with every compression
//! setting; a connection that breaks, a damaged page or a stranger speaking
//! another protocol leave the receiver's store at its last complete
//! snapshot, and say why.

use super::disk::{pages_differing, private_memory, TempDir};
use pagewise::{PageRange, Region, PAGE_SIZE};
use pagewise_snap::live::{live_snapshot, Destination, LiveOptions};
use pagewise_snap::wire::WireError;
use pagewise_snap::wire::{Compression, Event, Received, Receiver, Sender};
use pagewise_snap::DiskStore;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;

/// A receiver on a free loopback port, serving `conns` connections in a
/// thread; returns the address and what each connection heard.
fn receiver(
    dir: &std::path::Path,
    conns: usize,
) -> (String, JoinHandle<(Receiver, Vec<Received>)>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let rx = Receiver::new(DiskStore::create(dir, true).unwrap());
    let h = std::thread::spawn(move || {
        let mut got = Vec::new();
        for _ in 0..conns {
            let (s, _) = l.accept().unwrap();
            got.push(rx.serve(s, &mut |_: Event<'_>| {}).unwrap());
        }
        (rx, got)
    });
    (addr, h)
}

fn uffd_wp_or_skip() -> bool {
    if let Err(why) = pagewise_track::BackendKind::UffdWp.available_for_pid() {
        pagewise_testkit::skip!("{why}");
        return false;
    }
    true
}

/// A process whose two threads write random pages throughout is migrated
/// live over loopback, once with each compression setting: the receiver's
/// store holds exactly its memory at the stop each time, the receiver saw
/// every pass, and the process runs on.
#[test]
fn migration_over_loopback_holds_the_memory_at_the_stop() {
    let _one = super::common::one_target_at_a_time();
    if !uffd_wp_or_skip() {
        return;
    }
    let dir = TempDir::new("wire");
    let modes = [Compression::Auto, Compression::None, Compression::Lz4];
    let (addr, rx) = receiver(&dir.0, modes.len());
    let w = super::common::Writer::start(4096);
    std::thread::sleep(std::time::Duration::from_millis(30));
    let pid = w.pid;
    let opts = LiveOptions::default()
        .max_downtime_ms(20.0)
        .max_passes(10)
        .throttle(false);
    let mut truths = Vec::new();
    let mut reports = Vec::new();
    for mode in modes {
        let mut tx = Sender::connect(&addr, mode).unwrap();
        let mut truth = Vec::new();
        let r = live_snapshot(pid, &mut tx, "wire", &opts, &mut |_| {}, &mut || {
            truth = private_memory(pid);
        })
        .unwrap();
        let s = tx.stats();
        println!(
            "     {mode:?}: passes {:?}, downtime {:.2} ms, handover {:.1} ms, {} pages as {} bytes (lz4 {}, raw {}, zero {})",
            r.passes.iter().map(|p| p.pages).collect::<Vec<_>>(),
            r.downtime_ms,
            r.handover_ms,
            s.pages,
            s.wire_bytes,
            s.chunks_lz4,
            s.chunks_raw,
            s.chunks_zero
        );
        match mode {
            Compression::None => assert_eq!(s.chunks_lz4, 0),
            Compression::Lz4 => assert_eq!(s.chunks_raw, 0),
            _ => {}
        }
        assert!(r.handover_ms >= r.downtime_ms);
        truths.push(truth);
        reports.push((r, s));
    }
    let (rx, got) = rx.join().unwrap();
    for (i, ((r, s), g)) in reports.iter().zip(&got).enumerate() {
        assert_eq!(g.broken, None, "connection {i}");
        assert_eq!(g.saved.len(), 1);
        assert_eq!(g.saved[0].id, r.save.id, "the sender heard another id");
        assert_eq!(g.pages, s.pages, "pages received against sent");
        assert_eq!(g.passes as usize, r.passes.len() + 1, "passes (+ the last)");
        let wrong = pages_differing(&rx.store(), r.save.id, &truths[i]);
        assert_eq!(
            wrong, 0,
            "{:?}: {wrong} pages differ from the memory at the stop",
            modes[i]
        );
    }
    let a = w.read_all();
    std::thread::sleep(std::time::Duration::from_millis(30));
    assert_ne!(a, w.read_all(), "the process does not run on");
}

/// A destination that forwards to a sender and breaks off (drops the
/// connection) after `passes` passes.
struct BreakAfter {
    tx: Option<Sender>,
    passes: usize,
}

impl Destination for BreakAfter {
    fn pass(
        &mut self,
        regions: &[(Region, Vec<u8>)],
        changed: &[PageRange],
    ) -> pagewise_snap::Result<()> {
        if self.passes == 0 {
            self.tx = None;
            return Err(pagewise::MechError::os(
                "sending",
                std::io::Error::from_raw_os_error(libc::ECONNRESET),
            )
            .into());
        }
        self.passes -= 1;
        self.tx.as_mut().unwrap().pass(regions, changed)
    }
    fn finish(
        &mut self,
        _: &[(Region, Vec<u8>)],
        _: i32,
        _: &str,
    ) -> pagewise_snap::Result<pagewise_snap::SaveStats> {
        unreachable!("broken off before")
    }
}

/// One complete migration, then one whose connection breaks after its
/// first pass: the receiver says the connection broke and the snapshot was
/// discarded, and its store holds the first snapshot alone, intact.
#[test]
fn a_broken_connection_leaves_the_last_complete_snapshot() {
    let _one = super::common::one_target_at_a_time();
    if !uffd_wp_or_skip() {
        return;
    }
    let dir = TempDir::new("wire-broken");
    let (addr, rx) = receiver(&dir.0, 2);
    let w = super::common::Writer::start(1024);
    let pid = w.pid;
    let opts = LiveOptions::default();
    let mut truth = Vec::new();
    let mut tx = Sender::connect(&addr, Compression::Auto).unwrap();
    let first = live_snapshot(pid, &mut tx, "one", &opts, &mut |_| {}, &mut || {
        truth = private_memory(pid);
    })
    .unwrap();
    drop(tx);
    let mut broken = BreakAfter {
        tx: Some(Sender::connect(&addr, Compression::Auto).unwrap()),
        passes: 1,
    };
    let e = live_snapshot(pid, &mut broken, "two", &opts, &mut |_| {}, &mut || {});
    assert!(
        e.is_err(),
        "the broken destination did not fail the checkpoint"
    );
    let (rx, got) = rx.join().unwrap();
    assert_eq!(got[0].broken, None);
    let why = got[1]
        .broken
        .as_deref()
        .expect("the broken connection went unnoticed");
    assert!(why.contains("discarded"), "{why}");
    assert!(got[1].saved.is_empty());
    assert_eq!(rx.store().ids().unwrap(), vec![first.save.id]);
    drop(rx);
    let reopened = DiskStore::open(&dir.0).unwrap();
    assert_eq!(reopened.ids().unwrap(), vec![first.save.id]);
    assert_eq!(pages_differing(&reopened, first.save.id, &truth), 0);
}

/// Speaks the protocol by hand: the hello, a begin, one region, then a page
/// whose digest is `digest`; returns the receiver's reply bytes.
fn hand_made(addr: &str, digest: u64, page: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut m = hello();
    m.push(b'B');
    m.push(b'R');
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&0x10000u64.to_le_bytes());
    m.extend_from_slice(&(PAGE_SIZE as u64).to_le_bytes());
    let mut h = [0u8; 24];
    h[0] = b'P';
    h[4..8].copy_from_slice(&1u32.to_le_bytes());
    h[8..16].copy_from_slice(&0x10000u64.to_le_bytes());
    h[16..20].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    m.extend_from_slice(&h);
    m.extend_from_slice(&digest.to_le_bytes());
    m.extend_from_slice(page);
    m.push(b'D');
    m.push(b'F');
    m.extend_from_slice(&7i64.to_le_bytes());
    m.extend_from_slice(&0u32.to_le_bytes());
    m.push(b'Q');
    s.write_all(&m).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    reply
}

/// A page whose contents do not match its digest is refused with the
/// reason ('X'), and nothing is saved; the same message with the right
/// digest is saved; a sender of another protocol version is answered with
/// EPROTO.
#[test]
fn damaged_pages_and_strangers_are_refused() {
    let dir = TempDir::new("wire-damaged");
    let (addr, rx) = receiver(&dir.0, 3);
    let page = vec![0x5au8; PAGE_SIZE];
    let good = pagewise_mech::hash::page_hash(&page);
    let bad = hand_made(&addr, good ^ 1, &page);
    let x = bad.iter().position(|&b| b == b'X').expect("no refusal");
    assert!(
        String::from_utf8_lossy(&bad[x + 5..]).contains("digest does not match"),
        "{:?}",
        String::from_utf8_lossy(&bad[x..])
    );
    let ok = hand_made(&addr, good, &page);
    assert!(ok.contains(&b'K') && ok.contains(&b'A'), "{ok:?}");
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut m = Vec::new();
    for v in [pagewise_snap::wire::MAGIC, 99, 0] {
        m.extend_from_slice(&v.to_le_bytes());
    }
    s.write_all(&m).unwrap();
    let mut reply = [0u8; 20];
    s.read_exact(&mut reply).unwrap();
    assert_eq!(
        u32::from_le_bytes(reply[8..12].try_into().unwrap()),
        libc::EPROTO as u32
    );
    let (rx, got) = rx.join().unwrap();
    assert!(got[0].broken.as_deref().unwrap().contains("digest"));
    assert!(got[0].saved.is_empty());
    assert_eq!(got[1].broken, None);
    assert!(got[2].broken.as_deref().unwrap().contains("version 99"));
    let ids = rx.store().ids().unwrap();
    assert_eq!(ids.len(), 1, "only the good page's snapshot is saved");
    let snap = rx.store().load(ids[0]).unwrap();
    assert_eq!(
        snap.regions,
        vec![Region::new(0x10000, PAGE_SIZE as u64).unwrap()]
    );
    let mut back = vec![0u8; PAGE_SIZE];
    rx.store().read_page(snap.entries[0], &mut back).unwrap();
    assert_eq!(back, page);
}

/// The kind of message that crashed a receiver: a region declared one page below
/// the top of the address space, then zero pages whose end wraps past it.
/// Refused with the reason; the receiver serves the next connection.
#[test]
fn a_range_that_wraps_the_address_space_is_refused() {
    let dir = TempDir::new("wire-wrap");
    let (addr, rx) = receiver(&dir.0, 2);
    let top = u64::MAX - 2 * PAGE_SIZE as u64 + 1;
    let mut m = hello();
    m.push(b'B');
    m.push(b'R');
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&top.to_le_bytes());
    m.extend_from_slice(&(PAGE_SIZE as u64).to_le_bytes());
    let mut h = [0u8; 24];
    h[0] = b'P';
    h[1] = 2; // zero pages: no payload
    h[4..8].copy_from_slice(&2u32.to_le_bytes());
    h[8..16].copy_from_slice(&top.to_le_bytes());
    m.extend_from_slice(&h);
    m.extend_from_slice(&[0u8; 16]);
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&m).unwrap();
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let x = reply.iter().position(|&b| b == b'X').expect("no refusal");
    assert!(
        String::from_utf8_lossy(&reply[x + 5..]).contains("lie in no region"),
        "{:?}",
        String::from_utf8_lossy(&reply[x..])
    );
    // Still serving.
    let page = vec![0x11u8; PAGE_SIZE];
    let ok = hand_made(&addr, pagewise_mech::hash::page_hash(&page), &page);
    assert!(ok.contains(&b'A'), "{ok:?}");
    let (_rx, got) = rx.join().unwrap();
    assert!(got[0].saved.is_empty());
    assert_eq!(got[1].saved.len(), 1);
}

/// A receiver serving each connection in a thread of its own; returns the
/// address and, joined, what each connection heard (in the order they
/// ended).
type Served = JoinHandle<(std::sync::Arc<Receiver>, Vec<Received>)>;

fn concurrent_receiver(rx: Receiver, conns: usize) -> (String, Served) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let rx = std::sync::Arc::new(rx);
    let h = std::thread::spawn(move || {
        let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut ts = Vec::new();
        for _ in 0..conns {
            let (s, _) = l.accept().unwrap();
            let (rx, got) = (rx.clone(), got.clone());
            ts.push(std::thread::spawn(move || {
                let r = rx.serve(s, &mut |_: Event<'_>| {}).unwrap();
                got.lock().unwrap().push(r);
            }));
        }
        for t in ts {
            t.join().unwrap();
        }
        let got = std::mem::take(&mut *got.lock().unwrap());
        (rx, got)
    });
    (addr, h)
}

/// One page migrated by hand through a `Sender` (no process needed).
fn send_one_page(addr: &str, key: Option<&pagewise_snap::wire::Key>) -> pagewise_snap::Result<u64> {
    let mut tx = Sender::connect_with(addr, Compression::None, key)?;
    let r = Region::new(0x10000, PAGE_SIZE as u64).unwrap();
    let page = vec![0x3cu8; PAGE_SIZE];
    let regions = vec![(r, page)];
    tx.pass(
        &regions,
        &[PageRange {
            start: r.start,
            pages: 1,
        }],
    )?;
    tx.complete()?;
    Ok(tx.finish(&regions, 1, "by hand")?.id)
}

/// With a key, every message is authenticated: the right key migrates; a
/// sender without one, or with another, is refused and stores nothing.
#[test]
fn a_receiver_with_a_key_refuses_forged_senders() {
    use pagewise_snap::wire::Key;
    let dir = TempDir::new("wire-key");
    let key = Key::from_bytes(b"0123456789abcdef-shared").unwrap();
    let other = Key::from_bytes(b"0123456789abcdef-forged").unwrap();
    let rx = Receiver::new(DiskStore::create(&dir.0, true).unwrap()).with_key(key.clone());
    let (addr, h) = concurrent_receiver(rx, 3);
    send_one_page(&addr, Some(&key)).unwrap();
    let e = send_one_page(&addr, None).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise_snap::Error::Wire(WireError::KeyMismatch {
                we_have_key: false,
                ..
            })
        ),
        "{e}"
    );
    let e = send_one_page(&addr, Some(&other)).unwrap_err();
    assert!(
        // The receiver's own words, sent back.
        matches!(&e, pagewise_snap::Error::Wire(WireError::Refused { reason, .. })
            if reason.contains("authentication tag")),
        "{e}"
    );
    let (rx, got) = h.join().unwrap();
    assert_eq!(
        rx.store().ids().unwrap().len(),
        1,
        "only the keyed sender's snapshot"
    );
    let broken: Vec<_> = got.iter().filter_map(|g| g.broken.clone()).collect();
    assert_eq!(broken.len(), 2, "{got:?}");
    assert!(
        broken.iter().any(|b| b.contains("has no key")),
        "{broken:?}"
    );
    assert!(
        broken.iter().any(|b| b.contains("authentication tag")),
        "{broken:?}"
    );
    // A keyless receiver refuses a keyed sender too.
    let dir2 = TempDir::new("wire-nokey");
    let (addr, h) =
        concurrent_receiver(Receiver::new(DiskStore::create(&dir2.0, true).unwrap()), 1);
    let e = send_one_page(&addr, Some(&key)).unwrap_err();
    assert!(
        matches!(
            e,
            pagewise_snap::Error::Wire(WireError::KeyMismatch {
                we_have_key: true,
                ..
            })
        ),
        "{e}"
    );
    h.join().unwrap();
}

/// A peer that sends a byte now and then neither blocks a real migration
/// served meanwhile nor holds its connection past the limits ("timed
/// out"); a peer declaring more memory than the cap is refused before any
/// of it is held.
#[test]
fn slow_and_greedy_peers_are_bounded() {
    let dir = TempDir::new("wire-slow");
    let mut rx = Receiver::new(DiskStore::create(&dir.0, true).unwrap());
    rx.idle = std::time::Duration::from_secs(30);
    rx.max_time = std::time::Duration::from_secs(5);
    rx.max_bytes = 1 << 20;
    let (addr, h) = concurrent_receiver(rx, 3);
    // The slow peer: its hello, then a byte every 300 ms.
    let slow_addr = addr.clone();
    let slow = std::thread::spawn(move || {
        let mut s = TcpStream::connect(&slow_addr).unwrap();
        let m = hello();
        s.write_all(&m).unwrap();
        let mut reply = [0u8; pagewise_snap::wire::REPLY_LEN];
        s.read_exact(&mut reply).unwrap();
        s.write_all(b"B").unwrap();
        for _ in 0..100 {
            std::thread::sleep(std::time::Duration::from_millis(300));
            if s.write_all(b"E").is_err() {
                break;
            }
        }
    });
    // Meanwhile, a real migration goes through.
    send_one_page(&addr, None).unwrap();
    // A greedy peer: regions of 2 MiB, over the 1 MiB cap.
    let mut g = TcpStream::connect(&addr).unwrap();
    let mut m = hello();
    m.push(b'B');
    m.push(b'R');
    m.extend_from_slice(&1u32.to_le_bytes());
    m.extend_from_slice(&0x10000u64.to_le_bytes());
    m.extend_from_slice(&(2u64 << 20).to_le_bytes());
    g.write_all(&m).unwrap();
    let mut reply = Vec::new();
    let _ = g.read_to_end(&mut reply);
    let (_rx, got) = h.join().unwrap();
    slow.join().unwrap();
    let broken: Vec<String> = got.iter().filter_map(|g| g.broken.clone()).collect();
    assert!(
        broken.iter().any(|b| b.contains("timed out")),
        "the slow peer: {broken:?}"
    );
    assert!(
        broken
            .iter()
            .any(|b| b.contains("more than this receiver holds")),
        "the greedy peer: {broken:?}"
    );
    assert_eq!(got.iter().filter(|g| g.saved.len() == 1).count(), 1);
}

/// Memory is capped for the receiver as a whole: a peer whose regions fit
/// the cap alone is refused while another connection's copy holds most of
/// it; and chunks of zero pages over a copy that holds zeros commit no
/// memory (before: 3.3 MB of them on the wire made the receiver hold
/// 1.64 GB).
#[test]
fn memory_is_capped_for_the_receiver_as_a_whole() {
    // What the receiver commits is measured as the process's RSS: the test
    // runs alone in a process of its own, where no other test allocates.
    if crate::common::ran_alone(
        module_path!(),
        "memory_is_capped_for_the_receiver_as_a_whole",
    ) {
        return;
    }
    const MIB: u64 = 1 << 20;
    let dir = TempDir::new("wire-cap");
    let mut rx = Receiver::new(DiskStore::create(&dir.0, true).unwrap());
    rx.max_bytes = 384 * MIB;
    let (addr, h) = concurrent_receiver(rx, 2);
    let regions = |len: u64| {
        let mut m = hello();
        m.push(b'B');
        m.push(b'R');
        m.extend_from_slice(&1u32.to_le_bytes());
        m.extend_from_slice(&0x1000_0000u64.to_le_bytes());
        m.extend_from_slice(&len.to_le_bytes());
        m
    };
    let rss = || {
        let t = std::fs::read_to_string("/proc/self/status").unwrap();
        pagewise_mech::procfs::status_field(&t, "VmRSS").unwrap() * 1024
    };
    // A: 256 MiB declared, then all of it sent as zero pages.
    let mut a = TcpStream::connect(&addr).unwrap();
    a.write_all(&regions(256 * MIB)).unwrap();
    let before = rss();
    let chunk = pagewise_snap::wire::MAX_CHUNK_PAGES as u64;
    let mut m = Vec::new();
    for i in 0..(256 * MIB / PAGE_SIZE as u64 / chunk) {
        m.push(b'P');
        m.push(pagewise_snap::wire::ENC_ZERO);
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&(chunk as u32).to_le_bytes());
        m.extend_from_slice(&(0x1000_0000 + i * chunk * PAGE_SIZE as u64).to_le_bytes());
        m.extend_from_slice(&[0u8; 8]);
        for _ in 0..chunk {
            m.extend_from_slice(&pagewise_mech::hash::zero_page_hash().to_le_bytes());
        }
    }
    let wire = m.len();
    a.write_all(&m).unwrap();
    // The pass ends, the copy is done: 'K' answers once every chunk is in.
    a.write_all(b"E").unwrap();
    a.write_all(&0u32.to_le_bytes()).unwrap();
    a.write_all(b"D").unwrap();
    let mut complete = [0u8; 9];
    let mut reply = [0u8; pagewise_snap::wire::REPLY_LEN];
    a.read_exact(&mut reply).unwrap();
    a.read_exact(&mut complete).unwrap();
    assert_eq!(complete[0], b'K', "the copy is complete");
    let grew = rss().saturating_sub(before);
    // B: 192 MiB, within the cap alone, not beside A's 256.
    let mut b = TcpStream::connect(&addr).unwrap();
    b.write_all(&regions(192 * MIB)).unwrap();
    let mut r = Vec::new();
    let _ = b.read_to_end(&mut r);
    drop(a);
    let (_rx, got) = h.join().unwrap();
    let broken: Vec<String> = got.iter().filter_map(|g| g.broken.clone()).collect();
    assert!(
        broken
            .iter()
            .any(|b| b.contains("held by other connections")),
        "B: {broken:?}"
    );
    println!("{wire} bytes of zero chunks over 256 MiB: the receiver grew by {grew} bytes");
    assert!(
        grew < 32 * MIB,
        "zero chunks over 256 MiB committed {grew} bytes"
    );
}

/// A sender's hello of this version, without a key.
fn hello() -> Vec<u8> {
    let mut m = Vec::new();
    for v in [pagewise_snap::wire::MAGIC, pagewise_snap::wire::VERSION, 0] {
        m.extend_from_slice(&v.to_le_bytes());
    }
    m.extend_from_slice(&[7u8; pagewise_snap::wire::NONCE_LEN]);
    m
}

/// Trickling peers: one sending its region list a byte at a time (each
/// byte inside the idle limit) is cut when the connection has lasted its
/// limit, not when the message ends; one that says it has a key but sends
/// nothing authenticated is cut after one idle period. Neither lasts to
/// the end of its trickle (30 s).
#[test]
fn trickling_peers_are_cut_inside_a_message() {
    let dir = TempDir::new("wire-trickle");
    let mut rx = Receiver::new(DiskStore::create(&dir.0, true).unwrap())
        .with_key(pagewise_snap::wire::Key::from_bytes(b"0123456789abcdef-shared").unwrap());
    rx.idle = std::time::Duration::from_secs(1);
    rx.max_time = std::time::Duration::from_secs(2);
    let (addr, h) = concurrent_receiver(rx, 1);
    let t0 = std::time::Instant::now();
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut m = hello();
    m[8..12].copy_from_slice(&pagewise_snap::wire::FLAG_AUTH.to_le_bytes());
    s.write_all(&m).unwrap();
    let mut reply = [0u8; pagewise_snap::wire::REPLY_LEN];
    s.read_exact(&mut reply).unwrap();
    // What the store holds is not told before the key is shown.
    assert_eq!(u64::from_le_bytes(reply[12..20].try_into().unwrap()), 0);
    // BEGIN, then its tag a byte at a time.
    s.write_all(b"B").unwrap();
    for _ in 0..100 {
        std::thread::sleep(std::time::Duration::from_millis(300));
        if s.write_all(&[0]).is_err() {
            break;
        }
    }
    let (_rx, got) = h.join().unwrap();
    let took = t0.elapsed();
    let why = got[0].broken.clone().unwrap_or_default();
    assert!(why.contains("did not complete its greeting"), "{why}");
    assert!(
        took < std::time::Duration::from_secs(15),
        "held {took:?}: {why}"
    );
    // Keyless: a byte at a time inside one message.
    let dir = TempDir::new("wire-trickle-2");
    let mut rx = Receiver::new(DiskStore::create(&dir.0, true).unwrap());
    rx.idle = std::time::Duration::from_secs(1);
    rx.max_time = std::time::Duration::from_secs(2);
    let (addr, h) = concurrent_receiver(rx, 1);
    let t0 = std::time::Instant::now();
    let mut s = TcpStream::connect(&addr).unwrap();
    s.write_all(&hello()).unwrap();
    s.read_exact(&mut reply).unwrap();
    // BEGIN, then REGIONS with a count of 1000 regions, trickled.
    let mut msg = vec![b'B', b'R'];
    msg.extend_from_slice(&1000u32.to_le_bytes());
    msg.extend(std::iter::repeat_n(0u8, 16 * 1000));
    for b in msg {
        if s.write_all(&[b]).is_err() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        if t0.elapsed() > std::time::Duration::from_secs(30) {
            break;
        }
    }
    let (_rx, got) = h.join().unwrap();
    let took = t0.elapsed();
    let why = got[0].broken.clone().unwrap_or_default();
    assert!(why.contains("lasted longer than 2 s"), "{why}");
    assert!(
        took < std::time::Duration::from_secs(15),
        "held {took:?}: {why}"
    );
}

/// A receiver without a key takes snapshots from its own user only: a
/// peer on this machine running as another user is refused at its hello,
/// naming both users. (Needs root, to run the peer as another user.)
#[test]
fn a_keyless_receiver_refuses_other_users() {
    if pagewise_sys::process::geteuid() != 0 {
        pagewise_testkit::skip!("running a peer as another user needs root");
        return;
    }
    if std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_err()
    {
        pagewise_testkit::skip!("python3 is not installed (the peer of another user)");
        return;
    }
    let dir = TempDir::new("wire-user");
    let (addr, h) = concurrent_receiver(Receiver::new(DiskStore::create(&dir.0, true).unwrap()), 1);
    let (host, port) = addr.rsplit_once(':').unwrap();
    let hex: String = hello().iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "import socket; s = socket.create_connection(('{host}', {port})); \
         s.sendall(bytes.fromhex('{hex}')); print(len(s.recv(64)))"
    );
    use std::os::unix::process::CommandExt;
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (rx, got) = h.join().unwrap();
    let why = got[0].broken.clone().unwrap_or_default();
    assert!(why.contains("runs as uid 65534"), "{why}");
    assert!(rx.store().ids().unwrap().is_empty());
}
