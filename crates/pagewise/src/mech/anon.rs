//! Owned anonymous memory ([`AnonMemory`]) and a seedable generator
//! ([`Rng`]): what the far-memory engine's staging, the walk-cost
//! calibration, the built-in workloads and the tests use for memory of
//! their own.

use crate::{Error, Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::mem;

/// An owned private anonymous mapping, unmapped on drop. Its start is aligned
/// to 2 MiB so that huge pages can back it.
#[derive(Debug)]
pub struct AnonMemory {
    map: *mut u8,
    map_len: usize,
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; access goes through
// &self/&mut self or raw pointers whose users uphold their own contracts.
unsafe impl Send for AnonMemory {}
// SAFETY: as above; shared access only reads through raw pointers.
unsafe impl Sync for AnonMemory {}

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
        let map_len = len + HUGE_PAGE_SIZE;
        let map = mem::mmap_anonymous_flags(map_len, flags)
            .map_err(|e| Error::os(format!("mmap of {map_len} bytes"), e))?;
        let start = (map as usize).div_ceil(HUGE_PAGE_SIZE) * HUGE_PAGE_SIZE;
        Ok(AnonMemory {
            map,
            map_len,
            ptr: start as *mut u8,
            len,
        })
    }

    /// The region it covers.
    pub fn region(&self) -> Region {
        Region::new(self.ptr as u64, self.len as u64).expect("page-aligned by construction")
    }
    /// Start address.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }
    /// The whole mapping behind it, alignment slack included: `(start, end)`.
    pub fn mapping(&self) -> (u64, u64) {
        (self.map as u64, self.map as u64 + self.map_len as u64)
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// Number of pages.
    pub fn pages(&self) -> usize {
        self.len / PAGE_SIZE
    }
    /// Raw pointer to the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Copies the current contents out (a shadow copy for checks).
    pub fn snapshot(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read_into(0, &mut v);
        v
    }

    /// Copies `buf.len()` bytes at offset `off` into `buf`.
    pub fn read_into(&self, off: usize, buf: &mut [u8]) {
        assert!(off + buf.len() <= self.len);
        // SAFETY: the range is inside the mapping; volatile-free copy of plain bytes
        // (concurrent writers may race; callers that check results stop them first).
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(off), buf.as_mut_ptr(), buf.len()) }
    }

    /// Writes one byte at offset `off`.
    #[inline]
    pub fn write_byte(&self, off: usize, v: u8) {
        assert!(off < self.len);
        // SAFETY: in bounds; a volatile store so the write is never elided.
        unsafe { std::ptr::write_volatile(self.ptr.add(off), v) }
    }

    /// Reads one byte at offset `off`.
    #[inline]
    pub fn read_byte(&self, off: usize) -> u8 {
        assert!(off < self.len);
        // SAFETY: in bounds; volatile so the read really happens.
        unsafe { std::ptr::read_volatile(self.ptr.add(off)) }
    }

    /// Fills page `page` with `v` (4096 bytes written).
    #[inline]
    pub fn fill_page(&self, page: usize, v: u8) {
        assert!(page < self.pages());
        // SAFETY: the page is inside the mapping.
        unsafe { std::ptr::write_bytes(self.ptr.add(page * PAGE_SIZE), v, PAGE_SIZE) }
    }

    /// Copies `bytes` into the memory at offset `off`.
    pub fn write_at(&self, off: usize, bytes: &[u8]) {
        assert!(off + bytes.len() <= self.len);
        // SAFETY: the range is inside the mapping and `bytes` does not overlap it
        // (it is a Rust borrow, not memory handed out by this value).
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(off), bytes.len()) }
    }

    /// Copies page `page` into `out` (4096 bytes read).
    #[inline]
    pub fn read_page(&self, page: usize, out: &mut [u8; PAGE_SIZE]) {
        self.read_into(page * PAGE_SIZE, out)
    }

    /// `madvise` on a sub-range `[off, off+len)`.
    pub fn madvise(&self, off: usize, len: usize, advice: libc::c_int) -> std::io::Result<()> {
        assert!(off + len <= self.len);
        // SAFETY: the range lies inside memory this value owns; callers that
        // discard contents (MADV_DONTNEED) hold no references into it.
        unsafe { mem::madvise(self.addr() + off as u64, len, advice) }
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

impl Drop for AnonMemory {
    fn drop(&mut self) {
        // SAFETY: we own the whole mapping; no references outlive self.
        let _ = unsafe { mem::munmap(self.map, self.map_len) };
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
