//! The link model and delay injection.
//!
//! **Model (DiME's).** A fetch of a remote page costs twice the one-way
//! latency plus the page's transmission time, `bytes × 8 / bandwidth`. A
//! dirty victim written back on the way costs its transmission time too.
//! Transfers of one instance share its link: a transfer starts when the link
//! is free, so concurrent faults queue behind each other's transmissions
//! (propagation overlaps). Bandwidth 0 means unlimited.
//!
//! **Injection.** The engine cannot make a fault cheaper than its own cost:
//! the *floor*, what a fault costs at latency 0 (kernel delivery, the
//! handler's work, the wake-up). It waits only for the remainder of each
//! fault's modelled time, busy-waiting on the monotonic clock (sleeping is
//! far too coarse for microseconds), and carries any overshoot — a fault
//! whose modelled time is below the floor, or a wait that ran long — into
//! the next faults, so the mean converges on the model wherever the model is
//! above the floor.

use serde::Serialize;
use std::time::{Duration, Instant};

/// A link's configuration.
/// An input: built from its `Default` (no latency, unlimited bandwidth)
/// with its setters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct LinkConfig {
    /// One-way propagation delay, ns.
    pub latency_ns: u64,
    /// Bandwidth in bits per second; 0 is unlimited.
    pub bandwidth_bps: u64,
}

setters!(LinkConfig {
    latency_ns: u64,
    bandwidth_bps: u64,
});

impl LinkConfig {
    /// Transmission time of `bytes`, ns.
    pub(crate) fn transfer_ns(&self, bytes: u64) -> u64 {
        if self.bandwidth_bps == 0 {
            return 0;
        }
        ((bytes as u128 * 8 * 1_000_000_000) / self.bandwidth_bps as u128) as u64
    }

    /// Time of one fetch of `bytes` on an idle link, ns.
    pub fn fetch_ns(&self, bytes: u64) -> u64 {
        2 * self.latency_ns + self.transfer_ns(bytes)
    }
}

/// The link of one instance: when it is next free.
#[derive(Debug, Default)]
pub struct Link {
    free_at: Option<Instant>,
}

impl Link {
    /// Books a fetch of `bytes` (after writing back `writeback_bytes`) asked
    /// for at `now`; returns when the page arrives.
    pub fn book(
        &mut self,
        cfg: &LinkConfig,
        now: Instant,
        bytes: u64,
        writeback_bytes: u64,
    ) -> Instant {
        let start = match self.free_at {
            Some(t) if t > now => t,
            _ => now,
        };
        let tx = Duration::from_nanos(cfg.transfer_ns(bytes + writeback_bytes));
        self.free_at = Some(start + tx);
        start + tx + Duration::from_nanos(cfg.latency_ns.saturating_mul(2))
    }
}

/// Waits out the remainder of each fault's modelled time.
#[derive(Debug, Default)]
pub struct Injector {
    /// The part of a fault's cost the engine cannot see (delivery and
    /// wake-up), ns: what it subtracts from each wait.
    pub unseen_ns: u64,
    /// Time owed (positive) or overpaid (negative), ns.
    carry_ns: i64,
    /// What the last fault wanted in all, ns (see [`Injector::mapped`]).
    want_ns: i64,
}

impl Injector {
    /// An injector that subtracts `unseen_ns` from every wait.
    pub(crate) fn new(unseen_ns: u64) -> Self {
        Injector {
            unseen_ns,
            carry_ns: 0,
            want_ns: 0,
        }
    }

    /// The fault whose message arrived at `arrived` should complete at
    /// `due`: busy-waits for what is left and returns the time waited, ns.
    pub fn wait(&mut self, arrived: Instant, due: Instant) -> u64 {
        let modelled = due.saturating_duration_since(arrived).as_nanos() as i64;
        let want = modelled + self.carry_ns;
        let seen = arrived.elapsed().as_nanos() as i64;
        let wait = want - self.unseen_ns as i64 - seen;
        let waited = if wait > 0 {
            spin(Duration::from_nanos(wait as u64))
        } else {
            0
        };
        self.want_ns = want;
        self.settle(arrived);
        waited
    }

    /// The page of the fault that arrived at `arrived` is mapped now: what
    /// the mapping added is settled too.
    pub fn mapped(&mut self, arrived: Instant) {
        self.settle(arrived);
    }

    /// What this fault cost beyond its share is taken off the next ones.
    fn settle(&mut self, arrived: Instant) {
        let total = self.unseen_ns as i64 + arrived.elapsed().as_nanos() as i64;
        self.carry_ns = (self.want_ns - total).clamp(-1_000_000_000, 1_000_000_000);
    }
}

/// Busy-waits for `d`; returns the time really waited, ns.
pub fn spin(d: Duration) -> u64 {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        std::hint::spin_loop();
    }
    t0.elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetch_cost_is_dimes() {
        let l = LinkConfig {
            latency_ns: 1000,
            bandwidth_bps: 1_000_000_000,
        };
        // 4096 bytes at 1 Gb/s: 32768 ns, plus two latencies.
        assert_eq!(l.fetch_ns(4096), 2000 + 32_768);
        let unlimited = LinkConfig {
            latency_ns: 500,
            bandwidth_bps: 0,
        };
        assert_eq!(unlimited.fetch_ns(4096), 1000);
    }

    #[test]
    fn concurrent_fetches_queue_on_the_link() {
        let cfg = LinkConfig {
            latency_ns: 100,
            bandwidth_bps: 8_000_000_000, // 1 byte per ns
        };
        let mut link = Link::default();
        let now = Instant::now();
        let a = link.book(&cfg, now, 4096, 0);
        let b = link.book(&cfg, now, 4096, 0);
        assert_eq!((a - now).as_nanos(), 4096 + 200);
        // The second transmission waits for the first; propagation overlaps.
        assert_eq!((b - now).as_nanos(), 2 * 4096 + 200);
        // A write-back travels before the fetch.
        let later = now + Duration::from_secs(1);
        let c = link.book(&cfg, later, 4096, 4096);
        assert_eq!((c - later).as_nanos(), 2 * 4096 + 200);
    }
}
