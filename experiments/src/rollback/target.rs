//! The target of the rollback experiments, a program of its own (the
//! benchmark binary run as `pagewise-bench __rollback-target`): it holds
//! `MiB` of initialised state and answers inputs on stdin.
//!
//! An input is 16 bytes, `k` and `seed` (little-endian u64): the target
//! writes 8 bytes into each of `k` distinct pages chosen from the seed,
//! and answers with 8 bytes: a digest of what those places held before
//! (so the answer depends on the state, and equal states give equal
//! answers). `k = u64::MAX` ends it. Its first answer, once its state is
//! ready, is 8 bytes of `READY`.
//!
//! Modes: `serve` answers every input itself; `fork` is an AFL-style fork
//! server, a child per input whose answer the parent passes on after the
//! child has exited; `reload FILE` loads its state from `FILE` instead of
//! computing it, answers one input and exits.

use std::io::{Read, Write};

/// The first answer.
pub const READY: u64 = 0x5245_4144_5921_0000;

/// The state's initial contents: page `p` holds `p` in every 8 bytes,
/// mixed with the offset (no two pages alike, none zero).
pub fn fill(mem: &mut [u8]) {
    for (p, page) in mem.chunks_exact_mut(pagewise::PAGE_SIZE).enumerate() {
        for (i, w) in page.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&mix((p as u64) << 12 | i as u64).to_le_bytes());
        }
    }
}

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x | 1
}

/// The `k` distinct pages an input with `seed` writes, of `pages` (a
/// power of two).
pub fn pages_of(k: usize, seed: u64, pages: usize) -> impl Iterator<Item = usize> {
    let start = mix(seed) as usize;
    let stride = (mix(seed ^ 0x9e37) as usize) | 1;
    (0..k.min(pages)).map(move |i| start.wrapping_add(i.wrapping_mul(stride)) & (pages - 1))
}

/// One input: `k` pages written; the digest of what they held.
pub fn input(mem: &mut [u8], k: usize, seed: u64) -> u64 {
    let pages = mem.len() / pagewise::PAGE_SIZE;
    let mut h = 0u64;
    for (i, p) in pages_of(k, seed, pages).enumerate() {
        let off = p * pagewise::PAGE_SIZE + (mix(seed + i as u64) as usize % 512) * 8;
        let old = u64::from_le_bytes(mem[off..off + 8].try_into().expect("8 bytes"));
        h = mix(h ^ old);
        mem[off..off + 8].copy_from_slice(&mix(seed ^ old).to_le_bytes());
    }
    h
}

fn state(mib: usize, thp: bool) -> pagewise_mech::workload::AnonMemory {
    let mem = pagewise_mech::workload::AnonMemory::new(mib << 20).expect("mapping the state");
    if thp {
        let _ = pagewise_sys::mem::advise(mem.addr(), mem.len(), libc::MADV_HUGEPAGE);
    }
    mem
}

/// The target's `main`: `args` are `MiB thp|base serve|fork|reload FILE`.
pub fn main(args: &[String]) -> i32 {
    let (Some(mib), Some(kind), Some(mode)) = (
        args.first().and_then(|a| a.parse::<usize>().ok()),
        args.get(1),
        args.get(2),
    ) else {
        eprintln!("usage: __rollback-target MiB thp|base serve|fork|reload FILE");
        return 2;
    };
    let mem = state(mib, kind == "thp");
    // SAFETY: the mapping is this process's own, alive until exit, and
    // only this thread touches it (a fork's child has its own copy).
    let bytes = unsafe { std::slice::from_raw_parts_mut(mem.as_ptr(), mem.len()) };
    match mode.as_str() {
        "reload" => {
            let Some(path) = args.get(3) else { return 2 };
            let mut f = std::fs::File::open(path).expect("opening the state file");
            f.read_exact(bytes).expect("reading the state file");
        }
        _ => fill(bytes),
    }
    let mut out = std::io::stdout().lock();
    let mut inp = std::io::stdin().lock();
    if out
        .write_all(&READY.to_le_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        return 1;
    }
    let shared = pagewise_sys::mem::SharedAtomics::new(1).expect("a shared page");
    loop {
        let mut req = [0u8; 16];
        if inp.read_exact(&mut req).is_err() {
            return 0;
        }
        let k = u64::from_le_bytes(req[..8].try_into().expect("8"));
        let seed = u64::from_le_bytes(req[8..].try_into().expect("8"));
        if k == u64::MAX {
            return 0;
        }
        let h = match mode.as_str() {
            "fork" => {
                // SAFETY: the child only writes its own memory and a
                // shared page, then exits without unwinding.
                let child = unsafe {
                    pagewise_sys::process::fork_child(|| {
                        shared.at(0).store(
                            input(bytes, k as usize, seed),
                            std::sync::atomic::Ordering::SeqCst,
                        );
                        0
                    })
                }
                .expect("fork");
                pagewise_sys::process::wait_child(child).expect("waiting for the child");
                shared.at(0).load(std::sync::atomic::Ordering::SeqCst)
            }
            _ => input(bytes, k as usize, seed),
        };
        if out
            .write_all(&h.to_le_bytes())
            .and_then(|_| out.flush())
            .is_err()
        {
            return 1;
        }
        if mode == "reload" {
            return 0;
        }
    }
}
