//! An engine's counters: kept in atomics the handler thread and the
//! faulting threads update ([`Counters`], also the layout of an instance's
//! slot), read out as [`Stats`].

use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one instance.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Stats {
    /// Faults on remote pages (each one a fetch).
    pub page_fault_count: u64,
    /// Pages fetched from the remote memory.
    pub remote_fetches: u64,
    /// Local pages evicted.
    pub evictions: u64,
    /// Evicted pages whose contents had changed and were written back.
    pub writebacks: u64,
    /// Delay waited in total, ns.
    pub injected_delay_ns: u64,
    /// Modelled delay in total, ns (what the link model asked for).
    pub modelled_delay_ns: u64,
    /// What a fault costs at latency 0 here (the calibrated floor), ns.
    pub floor_ns: u64,
    /// The part of it the engine cannot see and takes off each delay, ns.
    pub unseen_ns: u64,
    /// Accesses to parked pages (policies learning which pages are used):
    /// mapped back at once, no delay, not fetches.
    pub soft_faults: u64,
    /// Pages parked.
    pub parks: u64,
    /// Pages local now.
    pub local_pages_now: u64,
    /// Time the handler spent on faults, from reading the message to
    /// mapping the page, waits included, ns.
    pub handler_ns: u64,
    /// Faults served in the thread that took them (the inline path).
    pub inline_faults: u64,
    /// Shared pages (after a `fork`, or merged by KSM) given a copy of
    /// their own so that they could be evicted.
    pub unshared_pages: u64,
    /// Faults of an instruction that needs more pages at once than the
    /// budget allows, served with its other pages lent beyond the budget
    /// (inline path; see the engine's `Loan`).
    pub lent_faults: u64,
    /// The most pages local beyond the budget at once, for lent pages
    /// and pages held for the kernel.
    pub overshoot_pages: u64,
    /// Injected delay per fault: counts in power-of-two buckets, bucket `i`
    /// holding delays in `[2^i, 2^(i+1))` ns (bucket 0 also holds 0).
    pub delay_histogram: Vec<u64>,
}

pub(crate) const HIST_BUCKETS: usize = 32;

/// The counters of one engine (also the layout of an instance slot).
#[derive(Default)]
#[repr(C)]
pub(crate) struct Counters {
    pub(crate) faults: AtomicU64,
    pub(crate) fetches: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) writebacks: AtomicU64,
    pub(crate) injected: AtomicU64,
    pub(crate) modelled: AtomicU64,
    pub(crate) local: AtomicU64,
    pub(crate) soft: AtomicU64,
    pub(crate) parks: AtomicU64,
    pub(crate) handled: AtomicU64,
    pub(crate) inline: AtomicU64,
    pub(crate) unshared: AtomicU64,
    pub(crate) lent: AtomicU64,
    /// A maximum, not a count.
    pub(crate) overshoot: AtomicU64,
    pub(crate) hist: [AtomicU64; HIST_BUCKETS],
}

impl Counters {
    pub(crate) fn all(&self) -> impl Iterator<Item = &AtomicU64> {
        [
            &self.faults,
            &self.fetches,
            &self.evictions,
            &self.writebacks,
            &self.injected,
            &self.modelled,
            &self.local,
            &self.soft,
            &self.parks,
            &self.handled,
            &self.inline,
            &self.unshared,
            &self.lent,
            &self.overshoot,
        ]
        .into_iter()
        .chain(self.hist.iter())
    }

    /// Whether a fault was served inline.
    pub(crate) fn served_inline(&self) -> bool {
        self.inline.load(Ordering::Relaxed) > 0
    }

    pub(crate) fn clear(&self) {
        self.all().for_each(|a| a.store(0, Ordering::Relaxed));
    }

    pub(crate) fn copy_from(&self, other: &Counters) {
        for (d, s) in self.all().zip(other.all()) {
            d.store(s.load(Ordering::Relaxed), Ordering::Relaxed);
        }
    }

    /// Adds `other`'s counts to these (not its local pages: a gauge; of
    /// the overshoots, the larger).
    pub(crate) fn add_from(&self, other: &Counters) {
        for (d, s) in self.all().zip(other.all()) {
            if std::ptr::eq(d, &self.overshoot) {
                d.fetch_max(s.load(Ordering::Relaxed), Ordering::Relaxed);
            } else if !std::ptr::eq(d, &self.local) {
                d.fetch_add(s.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        }
    }

    /// The counters as [`Stats`], with the calibration `(floor, unseen)`.
    pub(crate) fn snapshot(&self, (floor_ns, unseen_ns): (u64, u64)) -> Stats {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let mut hist: Vec<u64> = self.hist.iter().map(get).collect();
        while hist.len() > 1 && hist.last() == Some(&0) {
            hist.pop();
        }
        Stats {
            page_fault_count: get(&self.faults),
            remote_fetches: get(&self.fetches),
            evictions: get(&self.evictions),
            writebacks: get(&self.writebacks),
            injected_delay_ns: get(&self.injected),
            modelled_delay_ns: get(&self.modelled),
            floor_ns,
            unseen_ns,
            soft_faults: get(&self.soft),
            parks: get(&self.parks),
            local_pages_now: get(&self.local),
            handler_ns: get(&self.handled),
            inline_faults: get(&self.inline),
            unshared_pages: get(&self.unshared),
            lent_faults: get(&self.lent),
            overshoot_pages: get(&self.overshoot),
            delay_histogram: hist,
        }
    }
}

impl Stats {
    /// The sum of several engines' counters (the calibration of the first).
    pub(crate) fn sum<'a>(all: impl IntoIterator<Item = &'a Stats>) -> Stats {
        let mut t = Stats::default();
        for s in all {
            if t.floor_ns == 0 {
                t.floor_ns = s.floor_ns;
                t.unseen_ns = s.unseen_ns;
            }
            t.page_fault_count += s.page_fault_count;
            t.remote_fetches += s.remote_fetches;
            t.evictions += s.evictions;
            t.writebacks += s.writebacks;
            t.injected_delay_ns += s.injected_delay_ns;
            t.modelled_delay_ns += s.modelled_delay_ns;
            t.soft_faults += s.soft_faults;
            t.parks += s.parks;
            t.local_pages_now += s.local_pages_now;
            t.handler_ns += s.handler_ns;
            t.inline_faults += s.inline_faults;
            t.unshared_pages += s.unshared_pages;
            t.lent_faults += s.lent_faults;
            t.overshoot_pages = t.overshoot_pages.max(s.overshoot_pages);
            if t.delay_histogram.len() < s.delay_histogram.len() {
                t.delay_histogram.resize(s.delay_histogram.len(), 0);
            }
            for (d, v) in t.delay_histogram.iter_mut().zip(&s.delay_histogram) {
                *d += v;
            }
        }
        t
    }
}
