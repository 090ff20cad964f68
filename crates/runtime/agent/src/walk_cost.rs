//! What a page walk costs here, measured for the huge-page agent's ranking
//! before it starts: bounded in time ([`WALK_WITHIN`], on a thread of its
//! own), given up at once when the run is interrupted, and taken as
//! [`WALK_DEFAULT_NS`] where it cannot be measured.

use crate::Interrupt;
use std::time::{Duration, Instant};

/// Most time the measurement may take.
pub const WALK_WITHIN: Duration = Duration::from_secs(15);
/// What a page walk is taken to cost where it could not be measured, ns.
pub const WALK_DEFAULT_NS: f64 = 30.0;

/// What the measurement found.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum WalkCost {
    /// Measured: a walk's cost and the random loads it was told from
    /// (over 4 KiB pages, over 2 MiB pages where one could be made), ns,
    /// medians of 5 runs.
    Measured {
        /// What a page walk costs, ns.
        walk_ns: f64,
        /// A random load over 4 KiB pages, ns.
        ns_per_access_4k: f64,
        /// A random load over 2 MiB pages, ns.
        ns_per_access_2m: Option<f64>,
    },
    /// Not measured, why: [`WALK_DEFAULT_NS`] is taken.
    Default(String),
    /// The run was interrupted meanwhile: it ends.
    Interrupted,
}

impl WalkCost {
    /// The cost to rank with, ns: `None` when the run was interrupted.
    pub fn ns(&self) -> Option<f64> {
        match self {
            WalkCost::Measured { walk_ns, .. } => Some(*walk_ns),
            WalkCost::Default(_) => Some(WALK_DEFAULT_NS),
            WalkCost::Interrupted => None,
        }
    }
}

/// Measures what a page walk costs here (see the module).
pub fn measure(interrupt: &dyn Interrupt) -> WalkCost {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("pagewise-walk-cost".into())
        .spawn(move || {
            let _ = tx.send(pagewise_thp::calibrate_walk_cost(64 << 20, 1 << 20));
        });
    if let Err(e) = spawned {
        return WalkCost::Default(format!("no thread to measure it on: {e}"));
    }
    let deadline = Instant::now() + WALK_WITHIN;
    loop {
        if interrupt.requested() {
            return WalkCost::Interrupted;
        }
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Ok(c)) => {
                return match c.walk_ns {
                    Some(w) if w > 0.0 => WalkCost::Measured {
                        walk_ns: w,
                        ns_per_access_4k: c.ns_per_access_4k,
                        ns_per_access_2m: c.ns_per_access_2m,
                    },
                    _ => WalkCost::Default("no huge page could be made to measure it".into()),
                }
            }
            Ok(Err(e)) => return WalkCost::Default(e.to_string()),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {}
            Err(_) => {
                return WalkCost::Default(format!("it took more than {} s", WALK_WITHIN.as_secs()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Interrupted before it starts: said at once, without waiting for the
    /// measurement.
    #[test]
    fn an_interrupted_measurement_ends_at_once() {
        let t0 = Instant::now();
        let done = std::sync::atomic::AtomicBool::new(true);
        assert_eq!(measure(&done), WalkCost::Interrupted);
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
        assert_eq!(WalkCost::Interrupted.ns(), None);
        assert_eq!(WalkCost::Default("x".into()).ns(), Some(WALK_DEFAULT_NS));
    }
}
