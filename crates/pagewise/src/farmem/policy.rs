//! Replacement policies: which local page to evict when a remote page comes in.
//!
//! Pages are named by their index in the emulated memory (all regions of an
//! instance, in order). The engine tells a policy when a page becomes local
//! ([`Policy::inserted`]) and when it leaves without an eviction
//! ([`Policy::removed`]), and asks it for a victim ([`Policy::victim`]),
//! which the policy forgets at once.

use crate::workload::Rng;
use std::collections::VecDeque;

/// A replacement policy.
pub trait Policy: Send {
    /// Its name, as `--policy` takes it.
    fn name(&self) -> &str;
    /// Page `page` became local.
    fn inserted(&mut self, page: usize);
    /// Page `page` stopped being local without being chosen (the program
    /// dropped or unmapped it).
    fn removed(&mut self, page: usize);
    /// Chooses a local page to evict and forgets it; `None` when it tracks none.
    fn victim(&mut self) -> Option<usize>;
}

/// The policies built in, by name.
pub const NAMES: [&str; 2] = ["fifo", "random"];

/// A built-in policy by name.
pub fn by_name(name: &str, seed: u64) -> Option<Box<dyn Policy>> {
    match name {
        "fifo" => Some(Box::new(Fifo::default())),
        "random" => Some(Box::new(Random::new(seed))),
        _ => None,
    }
}

/// First in, first out (DiME's policy): the page local the longest goes first.
#[derive(Debug, Default)]
pub struct Fifo {
    /// Pages in arrival order, with the arrival they stand for.
    queue: VecDeque<(usize, u64)>,
    /// The current arrival of each local page; entries of the queue with an
    /// older one are stale (the page left, and maybe came back later).
    live: std::collections::HashMap<usize, u64>,
    arrivals: u64,
}

impl Policy for Fifo {
    fn name(&self) -> &str {
        "fifo"
    }
    fn inserted(&mut self, page: usize) {
        self.arrivals += 1;
        self.live.insert(page, self.arrivals);
        self.queue.push_back((page, self.arrivals));
    }
    fn removed(&mut self, page: usize) {
        self.live.remove(&page);
    }
    fn victim(&mut self) -> Option<usize> {
        while let Some((p, arrival)) = self.queue.pop_front() {
            if self.live.get(&p) == Some(&arrival) {
                self.live.remove(&p);
                return Some(p);
            }
        }
        None
    }
}

/// A local page chosen uniformly at random.
#[derive(Debug)]
pub struct Random {
    pages: Vec<usize>,
    /// Position of each page in `pages`.
    at: std::collections::HashMap<usize, usize>,
    rng: Rng,
}

impl Random {
    /// A random policy with a seed, so that runs repeat.
    pub fn new(seed: u64) -> Self {
        Random {
            pages: Vec::new(),
            at: Default::default(),
            rng: Rng::new(seed),
        }
    }

    fn take_at(&mut self, i: usize) -> usize {
        let p = self.pages.swap_remove(i);
        self.at.remove(&p);
        if let Some(&moved) = self.pages.get(i) {
            self.at.insert(moved, i);
        }
        p
    }
}

impl Policy for Random {
    fn name(&self) -> &str {
        "random"
    }
    fn inserted(&mut self, page: usize) {
        if !self.at.contains_key(&page) {
            self.at.insert(page, self.pages.len());
            self.pages.push(page);
        }
    }
    fn removed(&mut self, page: usize) {
        if let Some(&i) = self.at.get(&page) {
            self.take_at(i);
        }
    }
    fn victim(&mut self) -> Option<usize> {
        if self.pages.is_empty() {
            return None;
        }
        let i = self.rng.below(self.pages.len() as u64) as usize;
        Some(self.take_at(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_order_and_removals() {
        let mut f = Fifo::default();
        for p in [1, 2, 3, 4] {
            f.inserted(p);
        }
        f.removed(2);
        assert_eq!(f.victim(), Some(1));
        f.inserted(2);
        assert_eq!(f.victim(), Some(3));
        assert_eq!(f.victim(), Some(4));
        assert_eq!(f.victim(), Some(2));
        assert_eq!(f.victim(), None);
    }

    #[test]
    fn random_returns_each_page_once() {
        let mut r = Random::new(5);
        for p in 0..100 {
            r.inserted(p);
        }
        r.removed(50);
        let mut got: Vec<usize> = std::iter::from_fn(|| r.victim()).collect();
        got.sort();
        let want: Vec<usize> = (0..100).filter(|&p| p != 50).collect();
        assert_eq!(got, want);
    }
}
