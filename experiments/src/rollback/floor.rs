//! The floors the rollback experiments are set against: what copying the
//! same pages costs with nothing else around it.

use super::{target, Ms, Target, SEEDS};
use anyhow::{bail, Context, Result};
use std::time::Instant;

/// The writable mapping of at least `mib` MiB holding the target's state.
fn state_of(pid: i32, mib: usize) -> Result<u64> {
    let len = (mib << 20) as u64;
    Ok(pagewise_testkit::host::maps(Some(pid))?
        .into_iter()
        .filter(|m| m.write && m.end - m.start >= len)
        .max_by_key(|m| m.end - m.start)
        .context("finding the target's state")?
        .start)
}

/// One page each from or to `addrs` of process `pid`, in batches of 1024,
/// with `process_vm_readv` into `buf` (`read`) or `process_vm_writev` from
/// it.
fn scattered(pid: i32, addrs: &[u64], buf: &mut [u8], read: bool) -> Result<()> {
    let ps = pagewise::PAGE_SIZE;
    for (chunk, bytes) in addrs.chunks(1024).zip(buf.chunks_mut(1024 * ps)) {
        let remote: Vec<(u64, usize)> = chunk.iter().map(|&a| (a, ps)).collect();
        let want = chunk.len() * ps;
        let n = if read {
            pagewise_sys::process::process_vm_readv(pid, &remote, bytes)?
        } else {
            let local: Vec<&[u8]> = bytes.chunks(ps).collect();
            // SAFETY: `pid` is the benchmark's target, a child process.
            unsafe { pagewise_sys::process::process_vm_writev_gather(pid, &local, &remote) }?
        };
        if n != want {
            bail!(
                "process_vm_{}v moved {n} bytes of {want}",
                if read { "read" } else { "write" }
            );
        }
    }
    Ok(())
}

/// What writing `pages` distinct pages scattered over `mib` MiB of another
/// process costs with `process_vm_writev` alone, in batches of 1024 as a
/// restore writes them, ms (five rounds into a target holding the state):
/// the floor of a restore's copy on this machine.
pub(super) fn writev(mib: usize, pages: usize) -> Result<Ms> {
    let mib = mib.next_power_of_two();
    let t = Target::start(mib, false, &["serve"])?;
    let start = state_of(t.pid(), mib)?;
    let ps = pagewise::PAGE_SIZE;
    let total = (mib << 20) / ps;
    let mut src = vec![7u8; pages.min(total) * ps];
    let mut rounds = Vec::new();
    for round in 0..5u64 {
        let addrs: Vec<u64> = target::pages_of(pages, round, total)
            .map(|p| start + (p * ps) as u64)
            .collect();
        let t0 = Instant::now();
        scattered(t.pid(), &addrs, &mut src, false)?;
        rounds.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    drop(t);
    Ok(Ms::of(rounds))
}

/// The floor of a (b) cycle writing `k` pages of the `mib` MiB target
/// `pid` (idle, waiting for an input): `process_vm_readv` then
/// `process_vm_writev` of the pages an input writes (the same seeds), the
/// bytes read written back unchanged; and a plain copy of as many pages
/// scattered over `mib` MiB of this process, out and back. ms, `reps`
/// rounds each.
pub(super) fn cycle(pid: i32, mib: usize, k: usize, reps: usize) -> Result<(Ms, Ms)> {
    let ps = pagewise::PAGE_SIZE;
    let total = (mib << 20) / ps;
    let start = state_of(pid, mib)?;
    let mut buf = vec![0u8; k.min(total) * ps];
    let mut vm = Vec::new();
    for rep in 0..reps {
        let addrs: Vec<u64> = target::pages_of(k, rep as u64 % SEEDS, total)
            .map(|p| start + (p * ps) as u64)
            .collect();
        let t0 = Instant::now();
        scattered(pid, &addrs, &mut buf, true)?;
        scattered(pid, &addrs, &mut buf, false)?;
        vm.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    let mem = pagewise_mech::workload::AnonMemory::new(mib << 20)?;
    mem.write_pass(1, 1);
    let mut copy = Vec::new();
    for rep in 0..reps {
        let pages: Vec<usize> = target::pages_of(k, rep as u64 % SEEDS, total).collect();
        let t0 = Instant::now();
        for (i, &p) in pages.iter().enumerate() {
            mem.read_into(p * ps, &mut buf[i * ps..(i + 1) * ps]);
        }
        for (i, &p) in pages.iter().enumerate() {
            mem.write_at(p * ps, &buf[i * ps..(i + 1) * ps]);
        }
        copy.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok((Ms::of(vm), Ms::of(copy)))
}
