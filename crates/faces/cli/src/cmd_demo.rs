//! `pagewise demo`: every tracking backend over a writer, checked against a
//! shadow copy.

use anyhow::{bail, Result};

#[derive(clap::Args)]
pub struct DemoArgs {
    /// Size of the demo's memory in MiB.
    #[arg(long, default_value_t = 256)]
    mib: usize,
    /// One JSON object per backend, one per line: backend, skipped (with
    /// why) or collections, dirty_pages_reported, mean_collect_ms and
    /// shadow_matches.
    #[arg(long)]
    json: bool,
}

/// Tracks a writer thread over `mib` MiB with every available backend and
/// checks each collection against a shadow copy.
/// `demo --json`: one object a backend.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Line {
    /// A backend this machine cannot run.
    Skipped {
        /// The backend.
        backend: &'static str,
        /// Always true here.
        skipped: bool,
        /// Why it cannot run here.
        why: String,
    },
    /// A backend that ran, checked against a shadow copy.
    Ran {
        /// The backend.
        backend: &'static str,
        /// Always false here.
        skipped: bool,
        /// Collections made.
        collections: u32,
        /// Dirty pages the collections reported, in all.
        dirty_pages_reported: u64,
        /// Mean time of a collection.
        mean_collect_ms: f64,
        /// Whether every collection matched the shadow copy (the demo
        /// fails otherwise).
        shadow_matches: bool,
    },
}
impl crate::json::Printed for Line {}

pub fn demo(a: DemoArgs) -> Result<i32> {
    use pagewise::track::{BackendKind, DirtyTracker};
    use pagewise::workload::{AnonMemory, Rng};
    use pagewise::PAGE_SIZE;
    if a.mib == 0 {
        crate::usage!("--mib must be at least 1");
    }
    if !a.json {
        println!("pagewise demo: a program writes random pages of {} MiB; each backend reports what changed,", a.mib);
        println!(
            "and every report is checked against a shadow copy (a lost write would fail the demo).\n"
        );
    }
    for k in BackendKind::ALL {
        if let Err(why) = k.available_in_process() {
            if a.json {
                let v = Line::Skipped {
                    backend: k.name(),
                    skipped: true,
                    why: why.to_string(),
                };
                println!("{}", crate::json::line(&v)?);
            } else {
                println!("{:<10} skipped: {why}", k.name());
            }
            continue;
        }
        let mem = AnonMemory::new(a.mib << 20)?;
        mem.write_pass(1, 1);
        let mut shadow = mem.snapshot();
        let mut t = DirtyTracker::new(&[mem.region()], k)?;
        let mut rng = Rng::new(9);
        let mut total_ms = 0.0;
        let mut reported = 0;
        for round in 0..5u64 {
            for _ in 0..(mem.pages() / 20) {
                let p = rng.below(mem.pages() as u64) as usize;
                mem.write_byte(
                    p * PAGE_SIZE + (round as usize) * 8,
                    (round as u8).wrapping_add(p as u8) | 1,
                );
            }
            let c = t.collect()?;
            total_ms += c.stats.elapsed_ns as f64 / 1e6;
            reported += c.stats.pages_dirty;
            for r in &c.ranges {
                let off = (r.start - mem.addr()) as usize;
                mem.read_into(off, &mut shadow[off..off + r.len() as usize]);
            }
            if mem.snapshot() != shadow {
                bail!("{k}: a write was lost in round {round}");
            }
        }
        if a.json {
            let v = Line::Ran {
                backend: k.name(),
                skipped: false,
                collections: 5,
                dirty_pages_reported: reported,
                mean_collect_ms: total_ms / 5.0,
                shadow_matches: true,
            };
            println!("{}", crate::json::line(&v)?);
        } else {
            println!(
                "{:<10} 5 collections: {:>7} dirty pages reported, mean collection {:>8.3} ms, shadow copy matches",
                k.name(),
                reported,
                total_ms / 5.0
            );
        }
    }
    if !a.json {
        println!("\nNext: `pagewise probe`, `pagewise track -- CMD`, `pagewise bench track`.");
    }
    Ok(0)
}
