//! Periodic live checkpoints against ground truth: every checkpoint of a
//! series — of another process into a store or across a connection, or of
//! the caller's own regions while its threads write — holds exactly the
//! memory at its stop; after the first, a checkpoint copies only what was
//! written since the one before.

use super::disk::{pages_differing, private_memory, TempDir};
use pagewise::{Region, PAGE_SIZE};
use pagewise_mech::workload::AnonMemory;
use pagewise_snap::live::{Checkpointer, LiveOptions, OwnRegions, ProcessSource, StoreSeries};
use pagewise_snap::wire::{Compression, Receiver, Sender};
use pagewise_snap::DiskStore;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn uffd_wp_or_skip(outside: bool) -> bool {
    let k = pagewise_track::BackendKind::UffdWp;
    let r = if outside {
        k.available_for_pid()
    } else {
        k.available_in_process()
    };
    if let Err(why) = r {
        pagewise_testkit::skip!("{why}");
        return false;
    }
    true
}

/// The options of every checkpoint here.
fn opts() -> LiveOptions {
    LiveOptions::default()
        .max_downtime_ms(20.0)
        .max_passes(10)
        .throttle(false)
}

/// Five checkpoints of a process whose two threads write all the while, to
/// a store and, over one connection, to a receiver: each snapshot on both
/// sides equals the memory at its stop, and each checkpoint after the
/// first starts from less than the first (what was written since, not
/// all that memory holds).
#[test]
fn periodic_live_checkpoints_are_each_exact() {
    let _one = super::common::one_target_at_a_time();
    if !uffd_wp_or_skip(true) {
        return;
    }
    let w = super::common::Writer::start(4096);
    let pid = w.pid;
    for to_receiver in [false, true] {
        let dir = TempDir::new("series");
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let rx_dir = TempDir::new("series-rx");
        let rx_path = rx_dir.0.clone();
        let server = std::thread::spawn(move || {
            let (s, _) = l.accept().unwrap();
            let rx = Receiver::new(DiskStore::create(&rx_path, true).unwrap());
            let got = rx.serve(s, &mut |_| {}).unwrap();
            (rx, got)
        });
        let mut disk = DiskStore::create(&dir.0, true).unwrap();
        let mut series = StoreSeries::new(&mut disk);
        let mut tx = Sender::connect(&addr, Compression::Auto).unwrap();
        let mut cp = Checkpointer::new(ProcessSource::new(pid).unwrap(), opts());
        let mut truths = Vec::new();
        let mut reports = Vec::new();
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(50));
            let mut truth = Vec::new();
            let dest: &mut dyn pagewise_snap::live::Destination =
                if to_receiver { &mut tx } else { &mut series };
            let r = cp
                .checkpoint(dest, "", &mut |_| {}, &mut || {
                    truth = private_memory(pid);
                })
                .unwrap();
            truths.push(truth);
            reports.push(r);
        }
        drop(tx);
        let (rx, got) = server.join().unwrap();
        assert_eq!(got.broken, None);
        let store: &DiskStore = if to_receiver {
            &rx.store()
        } else {
            series.store
        };
        for (i, (r, t)) in reports.iter().zip(&truths).enumerate() {
            let wrong = pages_differing(store, r.save.id, t);
            assert_eq!(
                wrong, 0,
                "receiver {to_receiver}, checkpoint {i}: {wrong} pages differ"
            );
        }
        // The first pass of the first checkpoint copies all that memory
        // holds; of a later one, what was written since (the writers'
        // pages, not the rest). How many passes follow depends on the
        // writers' pace against the destination's.
        let first = reports[0].passes[0].pages;
        println!(
            "     receiver {to_receiver}: (bytes copied, first pass's pages) per checkpoint {:?}",
            reports
                .iter()
                .map(|r| (r.bytes_copied, r.passes[0].pages))
                .collect::<Vec<_>>()
        );
        assert!(
            reports[1..].iter().all(|r| r.passes[0].pages < first),
            "a later checkpoint's first pass copied as much as the first's"
        );
    }
}

/// Pre-copy of the caller's own regions (as a VMM copies guest memory)
/// while two of its threads write them; `pause` stops those threads. The
/// snapshot holds exactly the regions at the stop, and the threads were
/// paused exactly once, for the stop.
#[test]
fn precopy_of_own_regions_holds_them_at_the_stop() {
    if !uffd_wp_or_skip(false) {
        return;
    }
    let mem = Arc::new(AnonMemory::new(2048 * PAGE_SIZE).unwrap());
    mem.write_pass(1, 3);
    let region = mem.region();
    let quit = Arc::new(AtomicBool::new(false));
    // 0: run; 1: asked to pause; 2+k: k threads parked.
    let gate = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for seed in [1u64, 2] {
        let (mem, quit, gate) = (mem.clone(), quit.clone(), gate.clone());
        threads.push(std::thread::spawn(move || {
            let mut x = 0x9E37_79B9_7F4A_7C15u64 * seed;
            while !quit.load(Ordering::Relaxed) {
                if gate.load(Ordering::SeqCst) >= 1 {
                    gate.fetch_add(1, Ordering::SeqCst);
                    while gate.load(Ordering::SeqCst) != 0 && !quit.load(Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                    continue;
                }
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                mem.write_byte((x as usize >> 8) % (2048 * PAGE_SIZE), x as u8);
            }
        }));
    }
    let pauses = Arc::new(AtomicU64::new(0));
    let (g, n) = (gate.clone(), pauses.clone());
    let src = OwnRegions::new(&[region], move |pause| {
        if pause {
            n.fetch_add(1, Ordering::SeqCst);
            g.store(1, Ordering::SeqCst);
            while g.load(Ordering::SeqCst) < 3 {
                std::hint::spin_loop();
            }
        } else {
            g.store(0, Ordering::SeqCst);
        }
    })
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let dir = TempDir::new("own");
    let mut disk = DiskStore::create(&dir.0, true).unwrap();
    let mut truth: Vec<(Region, Vec<u8>)> = Vec::new();
    let mut cp = Checkpointer::new(src, opts());
    let r = cp
        .checkpoint(
            &mut StoreSeries::new(&mut disk),
            "own",
            &mut |_| {},
            &mut || {
                truth = vec![(region, mem.snapshot())];
            },
        )
        .unwrap();
    quit.store(true, Ordering::Relaxed);
    gate.store(0, Ordering::SeqCst);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(pages_differing(&disk, r.save.id, &truth), 0);
    assert_eq!(disk.load(r.save.id).unwrap().regions, vec![region]);
    assert_eq!(
        pauses.load(Ordering::SeqCst),
        1,
        "paused more than for the stop"
    );
    assert!(r.passes.len() >= 2, "{:?}", r.passes);
}
