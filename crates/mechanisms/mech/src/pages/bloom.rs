//! SmartMD's counting Bloom filter: which pages probably have a duplicate,
//! in 3 bytes of memory per 4 KiB page instead of a table of digests.
//!
//! Sizing as in SmartMD: 8 entries per base page, each a 3-bit saturating
//! counter (3/2^12 of the memory watched), indexed by 3 hash functions.
//! Every page is inserted once; a page is then labelled a duplicate when all
//! 3 of its counters are at least 2. A page with a real duplicate is always
//! labelled (no false negatives); a unique page is labelled only when other
//! pages raised all 3 of its counters (a false positive).
//!
//! The 3 indices come from the page's 128-bit digest ([`crate::hash`]) by
//! double hashing, `h1 + i·h2` (Kirsch and Mitzenmacher): as good as 3
//! independent functions for a Bloom filter, at the cost of one hash.

use crate::hash::PageDigest;

/// Entries per inserted page (SmartMD: 8 per base page).
pub const ENTRIES_PER_PAGE: usize = 8;
/// Bits per counter.
pub const COUNTER_BITS: u32 = 3;
/// Hash functions.
pub const HASHES: usize = 3;

const MAX: u64 = (1 << COUNTER_BITS) - 1;
/// Counters packed in one word (21 × 3 = 63 bits).
const PER_WORD: usize = 64 / COUNTER_BITS as usize;

/// A counting Bloom filter of 3-bit counters.
#[derive(Debug, Clone)]
pub struct CountingBloom {
    words: Vec<u64>,
    entries: usize,
}

impl CountingBloom {
    /// A filter sized for `pages` pages (at least one entry).
    pub fn for_pages(pages: usize) -> Self {
        let entries = (pages * ENTRIES_PER_PAGE).max(1);
        CountingBloom {
            words: vec![0; entries.div_ceil(PER_WORD)],
            entries,
        }
    }

    /// Number of counters.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// Bytes the counters take packed at 3 bits each (what SmartMD budgets).
    pub fn packed_bytes(&self) -> u64 {
        (self.entries as u64 * COUNTER_BITS as u64).div_ceil(8)
    }

    fn indices(&self, d: PageDigest) -> [usize; HASHES] {
        let h1 = d as u64;
        // Odd, so that the three indices differ whenever entries is a power of two.
        let h2 = ((d >> 64) as u64) | 1;
        let m = self.entries as u64;
        std::array::from_fn(|i| (h1.wrapping_add((i as u64).wrapping_mul(h2)) % m) as usize)
    }

    fn get(&self, i: usize) -> u64 {
        (self.words[i / PER_WORD] >> ((i % PER_WORD) as u32 * COUNTER_BITS)) & MAX
    }

    /// Counts one page in (counters saturate at 7).
    pub fn insert(&mut self, d: PageDigest) {
        for i in self.indices(d) {
            if self.get(i) < MAX {
                self.words[i / PER_WORD] += 1 << ((i % PER_WORD) as u32 * COUNTER_BITS);
            }
        }
    }

    /// Whether a page inserted with digest `d` probably has a duplicate.
    pub fn probably_duplicate(&self, d: PageDigest) -> bool {
        self.indices(d).iter().all(|&i| self.get(i) >= 2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let n = 20_000usize;
        let mut f = CountingBloom::for_pages(n);
        let digest = |k: u64| crate::hash::page_digest(&k.to_le_bytes());
        // Keys 0..n/10 twice (duplicates), the rest once.
        let keys: Vec<u64> = (0..n as u64 / 10)
            .chain(0..n as u64 / 10)
            .chain(n as u64..n as u64 + n as u64 * 8 / 10)
            .collect();
        assert_eq!(keys.len(), n);
        for &k in &keys {
            f.insert(digest(k));
        }
        for k in 0..n as u64 / 10 {
            assert!(f.probably_duplicate(digest(k)), "key {k} has a duplicate");
        }
        let fp = (n as u64..n as u64 + n as u64 * 8 / 10)
            .filter(|&k| f.probably_duplicate(digest(k)))
            .count();
        // Each of a unique page's 3 counters is ≥ 1 from others with
        // probability about 1 − e^(−3/8) ≈ 0.31; ≥ 2 needs more: well under 3 %.
        assert!(fp < n * 8 / 10 * 3 / 100, "{fp} false positives");
        assert_eq!(f.packed_bytes(), (n as u64 * 8 * 3).div_ceil(8));
    }

    #[test]
    fn counters_saturate() {
        let mut f = CountingBloom::for_pages(1);
        let d = crate::hash::page_digest(b"x");
        for _ in 0..20 {
            f.insert(d);
        }
        for i in f.indices(d) {
            assert_eq!(f.get(i), MAX);
        }
    }
}
