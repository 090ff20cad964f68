//! Page fingerprints: the one place pagewise hashes page contents.

use crate::PAGE_SIZE;

/// A 64-bit fingerprint of one page (xxh3-64). Two pages with equal contents
/// have equal fingerprints; unequal pages collide with probability about 2^-64.
pub type PageHash = u64;

/// Fingerprint of one page's bytes.
#[inline]
pub fn page_hash(page: &[u8]) -> PageHash {
    xxhash_rust::xxh3::xxh3_64(page)
}

/// Fingerprint of a page of zeros.
pub fn zero_page_hash() -> PageHash {
    static ZERO: std::sync::OnceLock<PageHash> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| page_hash(&ZERO_PAGE))
}

/// A 128-bit content address of one page (xxh3-128), for stores that keep
/// each distinct page once. Not cryptographic: stores that must not trust it
/// compare contents on a match.
pub type PageDigest = u128;

/// Content address of one page's bytes.
#[inline]
pub fn page_digest(page: &[u8]) -> PageDigest {
    xxhash_rust::xxh3::xxh3_128(page)
}

/// Content address of a page of zeros.
pub fn zero_page_digest() -> PageDigest {
    static ZERO: std::sync::OnceLock<PageDigest> = std::sync::OnceLock::new();
    *ZERO.get_or_init(|| page_digest(&ZERO_PAGE))
}

/// A page of zeros.
pub static ZERO_PAGE: [u8; PAGE_SIZE] = [0u8; PAGE_SIZE];

/// Checksum of arbitrary bytes (xxh3-64), for file formats.
#[inline]
pub fn checksum(bytes: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(bytes)
}

/// Fingerprints each page of `bytes` (a whole number of pages) into `out`.
pub fn hash_pages(bytes: &[u8], out: &mut [PageHash]) {
    debug_assert_eq!(bytes.len(), out.len() * PAGE_SIZE);
    for (page, h) in bytes.chunks_exact(PAGE_SIZE).zip(out.iter_mut()) {
        *h = page_hash(page);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn equal_pages_equal_hashes() {
        let mut a = vec![0u8; 2 * PAGE_SIZE];
        let mut h = [0; 2];
        hash_pages(&a, &mut h);
        assert_eq!(h[0], h[1]);
        assert_eq!(h[0], zero_page_hash());
        a[PAGE_SIZE + 17] = 1;
        hash_pages(&a, &mut h);
        assert_ne!(h[0], h[1]);
    }
}
