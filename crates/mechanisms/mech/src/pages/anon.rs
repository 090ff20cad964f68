//! Owned anonymous memory ([`AnonMemory`]) and a seedable generator
//! ([`Rng`]): what the far-memory engine's staging, the walk-cost
//! calibration, the built-in workloads and the tests use for memory of
//! their own.

use crate::{Error, Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::mem;

/// An owned private anonymous mapping, unmapped on drop. Its start is aligned
/// to 2 MiB so that huge pages can back it. Its bytes are reached by
/// bounds-checked copies and volatile accesses
/// ([`pagewise_sys::mem::OwnedMapping`]), never through a Rust reference:
/// other threads and the kernel may write it at any time.
#[derive(Debug)]
pub struct AnonMemory(mem::OwnedMapping);

impl AnonMemory {
    /// Maps `len` bytes (rounded up to whole pages), 2 MiB-aligned, unpopulated.
    pub fn new(len: usize) -> Result<Self> {
        Self::with_flags(len, 0)
    }

    /// Address space for `len` bytes that is not charged against the
    /// commit limit until written (`MAP_NORESERVE`): for mappings much larger
    /// than what they will hold.
    pub fn reserve(len: usize) -> Result<Self> {
        Self::with_flags(len, libc::MAP_NORESERVE)
    }

    fn with_flags(len: usize, flags: libc::c_int) -> Result<Self> {
        let len = len.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        mem::OwnedMapping::new(len, HUGE_PAGE_SIZE, flags)
            .map(AnonMemory)
            .map_err(|e| Error::os(format!("mmap of {} bytes", len + HUGE_PAGE_SIZE), e))
    }

    /// The region it covers.
    pub fn region(&self) -> Region {
        Region::new(self.addr(), self.len() as u64).expect("page-aligned by construction")
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.0.addr()
    }
    /// The whole mapping behind it, alignment slack included: `(start, end)`.
    pub fn mapping(&self) -> (u64, u64) {
        self.0.mapping()
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.len() / PAGE_SIZE
    }
    /// Raw pointer to the first byte (for calls that take an address).
    pub fn as_ptr(&self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// Copies the current contents out (a shadow copy for checks).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len()];
        self.read_into(0, &mut v);
        v
    }

    /// Copies `buf.len()` bytes at offset `off` into `buf` (concurrent
    /// writers may race; callers that check results stop them first).
    pub fn read_into(&self, off: usize, buf: &mut [u8]) {
        self.0.read_into(off, buf)
    }

    /// Writes one byte at offset `off` (volatile: never elided).
    #[inline]
    pub fn write_byte(&self, off: usize, v: u8) {
        self.0.write_byte(off, v)
    }

    /// Reads one byte at offset `off` (volatile: it really happens).
    #[inline]
    pub fn read_byte(&self, off: usize) -> u8 {
        self.0.read_byte(off)
    }

    /// Reads the 8-byte word `i` (at offset `8 i`; volatile).
    #[inline]
    pub fn read_word(&self, i: usize) -> u64 {
        self.0.read_word(i)
    }

    /// Writes the 8-byte word `i` (at offset `8 i`; volatile).
    #[inline]
    pub fn write_word(&self, i: usize, v: u64) {
        self.0.write_word(i, v)
    }

    /// Fills page `page` with `v` (4096 bytes written).
    #[inline]
    pub fn fill_page(&self, page: usize, v: u8) {
        self.0.fill(page * PAGE_SIZE, PAGE_SIZE, v)
    }

    /// Copies `bytes` into the memory at offset `off`.
    pub fn write_at(&self, off: usize, bytes: &[u8]) {
        self.0.write_at(off, bytes)
    }

    /// Copies page `page` into `out` (4096 bytes read).
    #[inline]
    pub fn read_page(&self, page: usize, out: &mut [u8; PAGE_SIZE]) {
        self.read_into(page * PAGE_SIZE, out)
    }

    /// `madvise` on a sub-range `[off, off+len)`, any advice (discarding
    /// the contents is sound: nothing refers into this memory).
    pub fn madvise(&self, off: usize, len: usize, advice: libc::c_int) -> std::io::Result<()> {
        self.0.madvise(off, len, advice)
    }

    /// Writes every page once: one byte (`bytes_per_page == 1`) or the whole page.
    pub fn write_pass(&self, bytes_per_page: usize, v: u8) {
        for p in 0..self.pages() {
            if bytes_per_page >= PAGE_SIZE {
                self.fill_page(p, v);
            } else {
                self.write_byte(p * PAGE_SIZE, v);
            }
        }
    }
}

/// A small, fast, seedable pseudo-random generator (xorshift64*), so that runs repeat.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed (0 is replaced).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    /// Next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `[0, n)`.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}
