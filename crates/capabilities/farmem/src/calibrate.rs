//! What a fault costs this machine at latency 0: the floor below which no
//! link can be emulated, measured on a scratch region.

use super::{link::LinkConfig, policy, Config, FarMemory, FaultPath, Hooks};
use crate::Result;
use pagewise_mech::workload::AnonMemory;
use pagewise_mech::PAGE_SIZE;
use serde::Serialize;
use std::time::Instant;

/// What a fault costs this machine at latency 0, measured on a scratch region.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Calibration {
    /// Mean added time per fault seen by the faulting thread, ns: the floor.
    pub floor_ns: u64,
    /// The part of it the handler does not see (delivery, wake-up), ns: what
    /// [`FarMemory::new`] takes as `unseen_ns`.
    pub unseen_ns: u64,
    /// Faults measured.
    pub faults: u64,
}

impl Calibration {
    /// A calibration measured elsewhere (the instance's, handed to a
    /// member): `floor_ns` and `unseen_ns` as [`Calibration`] says.
    pub fn known(floor_ns: u64, unseen_ns: u64) -> Calibration {
        Calibration {
            floor_ns,
            unseen_ns,
            faults: 0,
        }
    }

    /// No calibration: nothing is taken off the modelled delays.
    pub const NONE: Calibration = Calibration {
        floor_ns: 0,
        unseen_ns: 0,
        faults: 0,
    };
}

/// Measures the floor on `path`: `pages` faults with a budget of one page
/// and an unlimited link at latency 0 (see `calibrate_once`), against the
/// same writes to plain memory (in five rounds; the medians).
pub fn calibrate(pages: usize, path: FaultPath) -> Result<Calibration> {
    // Five rounds, the median of each figure: one slow wake-up of a vCPU
    // must not set the floor for everything after.
    const ROUNDS: usize = 5;
    let per = (pages / ROUNDS).max(16);
    let mut floors = Vec::new();
    let mut unseen = Vec::new();
    let mut faults = 0;
    for _ in 0..ROUNDS {
        let (f, u, n) = calibrate_once(per, path)?;
        floors.push(f);
        unseen.push(u);
        faults += n;
    }
    floors.sort_unstable();
    unseen.sort_unstable();
    Ok(Calibration {
        floor_ns: floors[ROUNDS / 2],
        unseen_ns: unseen[ROUNDS / 2],
        faults,
    })
}

/// A scratch instance over `mem`: FIFO, an unlimited link at latency 0,
/// no calibration, faults served on `path` — what a fault costs the engine
/// itself (calibration and the benchmarks' fault-path measurement use it).
pub fn at_latency_zero(mem: &AnonMemory, local_pages: usize, path: FaultPath) -> Result<FarMemory> {
    let config = Config {
        local_pages,
        link: LinkConfig {
            latency_ns: 0,
            bandwidth_bps: 0,
        },
    };
    FarMemory::new_with(
        &[mem.region()],
        config,
        Box::new(policy::Fifo::default()),
        Calibration::NONE,
        Hooks {
            fault_path: path,
            ..Hooks::default()
        },
    )
}

/// One round of [`calibrate`]: (floor, unseen part, faults).
///
/// Inline, the faults are the steady state of an emulated program short of
/// memory: pages written in turn through a budget of one, so that every
/// fault evicts a written page and fetches one with data; everything but
/// the signal's delivery and return is then seen by the engine. More pages
/// than one instruction is ever lent ([`crate::engine::LOAN_MAX`]): with
/// two, the writing instruction came back to a page it had fetched, the
/// engine lent it both and the faults stopped after five, so that a
/// round's floor was its first faults' cost (23-33 µs with the other vCPU
/// idle, against 7 µs per fault in the steady state). On the handler
/// thread, first touches of fresh pages through a budget of one: the
/// faulting thread's wake-up, unseen, dominates either way.
fn calibrate_once(pages: usize, path: FaultPath) -> Result<(u64, u64, u64)> {
    let span = match path {
        FaultPath::Inline => 2 * crate::engine::LOAN_MAX,
        FaultPath::Thread => pages,
    };
    let touch = |mem: &AnonMemory| {
        let t0 = Instant::now();
        for i in 0..pages {
            mem.write_byte((i % span) * PAGE_SIZE, i as u8);
        }
        t0.elapsed().as_nanos() as u64
    };
    let plain = AnonMemory::new(span * PAGE_SIZE)?;
    let base = touch(&plain);
    let mem = AnonMemory::new(span * PAGE_SIZE)?;
    let fm = at_latency_zero(&mem, 1, path)?;
    let t = touch(&mem);
    let st = fm.stop()?;
    let faults = st.page_fault_count.max(1);
    let floor_ns = t.saturating_sub(base) / faults;
    Ok((
        floor_ns,
        floor_ns.saturating_sub(st.handler_ns / faults),
        faults,
    ))
}
