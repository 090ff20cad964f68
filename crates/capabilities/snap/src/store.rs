//! The same-page-merging page store: every distinct page content is kept once,
//! named by a [`PageId`], and reference-counted.
//!
//! Pages are addressed by their xxh3-128 digest ([`pagewise_mech::hash::page_digest`]).
//! In verify mode (the default) a digest match is confirmed by comparing the
//! bytes, so two different pages are never merged even if their digests
//! collide; without it the digest alone decides (about 2^-128 per pair for
//! non-adversarial data, but xxh3 is not a cryptographic hash).
//!
//! The zero page is recognised and never stored: it is [`PageId::ZERO`]. Page
//! bytes live in 2 MiB slabs; a freed page's slot is reused by the next new
//! page.

use pagewise_mech::hash::{page_digest, zero_page_digest, PageDigest, ZERO_PAGE};
use pagewise_mech::PAGE_SIZE;
use serde::Serialize;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Names one stored page content. [`PageId::ZERO`] is the page of zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PageId(pub(crate) u32);

impl PageId {
    /// The page of zeros; never stored, never counted as unique.
    pub const ZERO: PageId = PageId(0);

    /// Whether this is the zero page.
    pub(crate) fn is_zero(self) -> bool {
        self.0 == 0
    }

    /// The raw number (0 for the zero page).
    pub fn raw(self) -> u32 {
        self.0
    }
}

/// Pages per slab (2 MiB).
const SLAB_PAGES: usize = 512;

/// What the store holds and what it saves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct StoreStats {
    /// Distinct non-zero pages stored.
    pub unique_pages: u64,
    /// References to stored (non-zero) pages: the pages the store stands for.
    pub referenced_pages: u64,
    /// References to the zero page (not stored).
    pub zero_pages: u64,
    /// Bytes of page data kept.
    pub bytes_stored: u64,
    /// Bytes the references stand for, zero pages included.
    pub bytes_referenced: u64,
    /// `bytes_referenced - bytes_stored`.
    pub bytes_saved: u64,
    /// Digest matches whose contents differed (verify mode), kept apart.
    pub digest_collisions: u64,
}

/// The digests are already uniformly distributed: hash maps use their low bits as is.
#[derive(Default)]
struct DigestHasher(u64);

impl Hasher for DigestHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes.iter().take(8) {
            self.0 = (self.0 << 8) | b as u64;
        }
    }
    fn write_u128(&mut self, v: u128) {
        self.0 = v as u64;
    }
}

type DigestMap<V> = HashMap<PageDigest, V, BuildHasherDefault<DigestHasher>>;

/// A content-addressed, reference-counted store of 4 KiB pages.
pub struct PageStore {
    verify: bool,
    slabs: Vec<Box<[u8]>>,
    /// Digest of each page, indexed by `PageId`; entry 0 stands for the zero page.
    digests: Vec<PageDigest>,
    /// References of each page (0: a free slot), indexed like `digests`.
    refs: Vec<u32>,
    free: Vec<u32>,
    /// First page stored with each digest.
    index: DigestMap<u32>,
    /// Further pages with a digest already in `index` but other contents.
    collided: DigestMap<Vec<u32>>,
    unique: u64,
    referenced: u64,
    zero_refs: u64,
    collisions: u64,
    #[cfg(test)]
    weak_digest: bool,
}

impl std::fmt::Debug for PageStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageStore")
            .field("verify", &self.verify)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Default for PageStore {
    fn default() -> Self {
        Self::new(true)
    }
}

impl PageStore {
    /// An empty store; `verify` compares contents on every digest match.
    pub fn new(verify: bool) -> Self {
        PageStore {
            verify,
            slabs: Vec::new(),
            digests: vec![zero_page_digest()],
            refs: vec![0],
            free: Vec::new(),
            index: DigestMap::default(),
            collided: DigestMap::default(),
            unique: 0,
            referenced: 0,
            zero_refs: 0,
            collisions: 0,
            #[cfg(test)]
            weak_digest: false,
        }
    }

    fn digest(&self, page: &[u8]) -> PageDigest {
        #[cfg(test)]
        if self.weak_digest {
            // Four bits: collisions on purpose, to test verify mode.
            return page_digest(page) & 0xf;
        }
        page_digest(page)
    }

    /// Stores `page` (exactly one page of bytes) if its content is new and
    /// returns its id with one more reference.
    pub fn intern(&mut self, page: &[u8]) -> PageId {
        assert_eq!(page.len(), PAGE_SIZE, "a page is {PAGE_SIZE} bytes");
        // A page that begins with zeros may be the zero page, never stored:
        // digested where it is.
        if page[..8] == [0; 8] {
            let d = self.digest(page);
            return self.intern_digested(page, d);
        }
        // Otherwise copied into a free slot first and digested there, hot
        // in the cache: the page is read from memory once, not twice. A
        // content the store has already gives the slot back.
        let id = self.slot_for_new();
        self.slot_mut(id).copy_from_slice(page);
        self.intern_slot(id)
    }

    /// `n` slots for pages to be read straight into the store
    /// ([`slots_mut`](Self::slots_mut)), ascending; each is then interned
    /// where it is ([`intern_slot`](Self::intern_slot)) or given back
    /// ([`unreserve`](Self::unreserve)).
    pub(crate) fn reserve(&mut self, n: usize) -> Vec<u32> {
        let mut ids: Vec<u32> = (0..n).map(|_| self.slot_for_new()).collect();
        ids.sort_unstable();
        ids
    }

    /// Gives back reserved slots not interned.
    pub(crate) fn unreserve(&mut self, ids: &[u32]) {
        self.free.extend_from_slice(ids);
    }

    /// The bytes of reserved slots `ids` (ascending, as
    /// [`reserve`](Self::reserve) gives them), each writable, in order.
    pub(crate) fn slots_mut(&mut self, ids: &[u32]) -> Vec<&mut [u8]> {
        let mut out = Vec::with_capacity(ids.len());
        let mut slabs = self.slabs.iter_mut().enumerate();
        // The slab being cut, what is left of it, and where that starts.
        let mut cur: Option<(usize, &mut [u8], usize)> = None;
        for &id in ids {
            let s = id as usize - 1;
            let (slab, off) = (s / SLAB_PAGES, (s % SLAB_PAGES) * PAGE_SIZE);
            while cur.as_ref().is_none_or(|c| c.0 != slab) {
                let (i, b) = slabs
                    .next()
                    .expect("reserved slots are ascending and allocated");
                cur = Some((i, &mut b[..], 0));
            }
            let (_, rest, base) = cur.as_mut().expect("set above");
            let (_, tail) = std::mem::take(rest).split_at_mut(off - *base);
            let (page, tail) = tail.split_at_mut(PAGE_SIZE);
            *rest = tail;
            *base = off + PAGE_SIZE;
            out.push(page);
        }
        out
    }

    fn slot(&self, id: u32) -> &[u8] {
        let s = id as usize - 1;
        let off = (s % SLAB_PAGES) * PAGE_SIZE;
        &self.slabs[s / SLAB_PAGES][off..off + PAGE_SIZE]
    }

    /// Interns the page a reserved slot holds, digested where it is: its
    /// id with one more reference. A content already stored (or the zero
    /// page) gives the slot back.
    pub(crate) fn intern_slot(&mut self, id: u32) -> PageId {
        let d = self.digest(self.slot(id));
        if let Some(e) = self.stored(d, self.slot(id)) {
            self.incref(e);
            self.free.push(id);
            return e;
        }
        self.place(id, d);
        self.index_new(d, id);
        PageId(id)
    }

    /// The page already stored (or the zero page) with digest `d` and
    /// contents `page` (compared in verify mode), if any.
    fn stored(&self, d: PageDigest, page: &[u8]) -> Option<PageId> {
        if d == zero_page_digest() && (!self.verify || page == ZERO_PAGE) {
            return Some(PageId::ZERO);
        }
        let first = *self.index.get(&d)?;
        if !self.verify || self.page(PageId(first)) == page {
            return Some(PageId(first));
        }
        self.collided
            .get(&d)?
            .iter()
            .copied()
            .find(|&c| self.page(PageId(c)) == page)
            .map(PageId)
    }

    /// Indexes new page `id` with digest `d`: first with it, or a
    /// collision kept apart.
    fn index_new(&mut self, d: PageDigest, id: u32) {
        match self.index.entry(d) {
            Entry::Occupied(_) => {
                self.collisions += 1;
                self.collided.entry(d).or_default().push(id);
            }
            Entry::Vacant(v) => {
                v.insert(id);
            }
        }
    }

    /// Counts slot `id`, holding a new content with digest `d`, as stored.
    fn place(&mut self, id: u32, d: PageDigest) {
        self.digests[id as usize] = d;
        self.refs[id as usize] = 1;
        self.unique += 1;
        self.referenced += 1;
    }

    /// [`PageStore::intern`] with the digest already computed by the caller.
    pub(crate) fn intern_digested(&mut self, page: &[u8], digest: PageDigest) -> PageId {
        assert_eq!(page.len(), PAGE_SIZE, "a page is {PAGE_SIZE} bytes");
        if let Some(e) = self.stored(digest, page) {
            self.incref(e);
            return e;
        }
        let id = self.store_new(page, digest);
        self.index_new(digest, id.0);
        id
    }

    /// A free slot (its references 0), made if there is none.
    fn slot_for_new(&mut self) -> u32 {
        match self.free.pop() {
            Some(id) => id,
            None => {
                let id = self.refs.len() as u32;
                self.digests.push(zero_page_digest());
                self.refs.push(0);
                // Slot `id - 1` of the slabs (id 0 is the zero page).
                if (id as usize - 1) / SLAB_PAGES >= self.slabs.len() {
                    self.slabs
                        .push(vec![0u8; SLAB_PAGES * PAGE_SIZE].into_boxed_slice());
                }
                id
            }
        }
    }

    fn store_new(&mut self, page: &[u8], digest: PageDigest) -> PageId {
        let id = self.slot_for_new();
        self.slot_mut(id).copy_from_slice(page);
        self.place(id, digest);
        PageId(id)
    }

    fn slot_mut(&mut self, id: u32) -> &mut [u8] {
        let s = id as usize - 1;
        let off = (s % SLAB_PAGES) * PAGE_SIZE;
        &mut self.slabs[s / SLAB_PAGES][off..off + PAGE_SIZE]
    }

    /// The id of a live page from its raw number ([`PageId::raw`]); 0 is the
    /// zero page. `None` for a number that names no page stored now.
    pub fn live_id(&self, raw: u32) -> Option<PageId> {
        (raw == 0 || self.refs.get(raw as usize).is_some_and(|&r| r > 0)).then_some(PageId(raw))
    }

    /// The bytes of page `id`.
    ///
    /// # Panics
    /// If `id` is not a live page of this store.
    pub fn page(&self, id: PageId) -> &[u8] {
        if id.is_zero() {
            return &ZERO_PAGE;
        }
        assert!(
            self.refs.get(id.0 as usize).is_some_and(|&r| r > 0),
            "page {} is not in the store",
            id.0
        );
        let s = id.0 as usize - 1;
        let off = (s % SLAB_PAGES) * PAGE_SIZE;
        &self.slabs[s / SLAB_PAGES][off..off + PAGE_SIZE]
    }

    /// The digest of page `id`.
    pub(crate) fn digest_of(&self, id: PageId) -> PageDigest {
        self.digests[id.0 as usize]
    }

    /// References held on page `id` (0 for a free id; the zero page counts its references).
    pub fn refs(&self, id: PageId) -> u64 {
        if id.is_zero() {
            return self.zero_refs;
        }
        self.refs.get(id.0 as usize).map_or(0, |&r| r as u64)
    }

    /// Adds one reference to a live page.
    pub fn incref(&mut self, id: PageId) {
        if id.is_zero() {
            self.zero_refs += 1;
            return;
        }
        let r = &mut self.refs[id.0 as usize];
        assert!(*r > 0, "incref of free page {}", id.0);
        *r += 1;
        self.referenced += 1;
    }

    /// Drops one reference; the page is freed with its last one.
    pub fn decref(&mut self, id: PageId) {
        if id.is_zero() {
            self.zero_refs -= 1;
            return;
        }
        let r = &mut self.refs[id.0 as usize];
        assert!(*r > 0, "decref of free page {}", id.0);
        *r -= 1;
        self.referenced -= 1;
        if *r == 0 {
            let digest = self.digests[id.0 as usize];
            self.unique -= 1;
            if self.collided.is_empty() {
                // The common case: one page per digest, one probe.
                if let Entry::Occupied(e) = self.index.entry(digest) {
                    if *e.get() == id.0 {
                        e.remove();
                    }
                }
            } else {
                self.forget_collided(digest, id.0);
            }
            self.free.push(id.0);
        }
    }

    /// Removes page `id` with `digest` from the indexes when some digest
    /// has several pages.
    fn forget_collided(&mut self, digest: PageDigest, id: u32) {
        if self.index.get(&digest) == Some(&id) {
            // Promote a collided page with the same digest, if any.
            match self.collided.get_mut(&digest).and_then(|v| v.pop()) {
                Some(next) => {
                    self.index.insert(digest, next);
                }
                None => {
                    self.index.remove(&digest);
                }
            }
        } else if let Some(v) = self.collided.get_mut(&digest) {
            v.retain(|&c| c != id);
        }
        if self.collided.get(&digest).is_some_and(Vec::is_empty) {
            self.collided.remove(&digest);
        }
    }

    /// What the store holds.
    pub fn stats(&self) -> StoreStats {
        let page = PAGE_SIZE as u64;
        let bytes_stored = self.unique * page;
        let bytes_referenced = (self.referenced + self.zero_refs) * page;
        StoreStats {
            unique_pages: self.unique,
            referenced_pages: self.referenced,
            zero_pages: self.zero_refs,
            bytes_stored,
            bytes_referenced,
            bytes_saved: bytes_referenced.saturating_sub(bytes_stored),
            digest_collisions: self.collisions,
        }
    }

    #[cfg(test)]
    pub(crate) fn with_weak_digest(verify: bool) -> Self {
        let mut s = Self::new(verify);
        s.weak_digest = true;
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagewise_mech::workload::Rng;

    fn page(seed: u64) -> Vec<u8> {
        let mut rng = Rng::new(seed);
        (0..PAGE_SIZE).map(|_| rng.next_u64() as u8).collect()
    }

    #[test]
    fn pages_read_into_reserved_slots_are_interned_where_they_are() {
        let mut s = PageStore::new(true);
        let kept = s.intern(&page(7));
        // Spread over two slabs, with a slot freed before among them.
        for k in 0..SLAB_PAGES as u64 {
            let id = s.intern(&page(100 + k));
            s.decref(id);
        }
        let ids = s.reserve(SLAB_PAGES + 3);
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "ascending");
        let contents: Vec<Vec<u8>> = (0..ids.len() as u64)
            .map(|k| match k % 4 {
                0 => page(7),
                1 => vec![0u8; PAGE_SIZE],
                _ => page(1000 + k),
            })
            .collect();
        for (slot, c) in s.slots_mut(&ids).into_iter().zip(&contents) {
            slot.copy_from_slice(c);
        }
        let got: Vec<PageId> = ids.iter().map(|&id| s.intern_slot(id)).collect();
        for (k, (g, c)) in got.iter().zip(&contents).enumerate() {
            assert_eq!(s.page(*g), &c[..], "page {k} reads back as written");
            match k % 4 {
                0 => assert_eq!(*g, kept, "a content already stored is shared"),
                1 => assert_eq!(*g, PageId::ZERO),
                _ => assert_eq!(s.refs(*g), 1),
            }
        }
        let mut distinct: std::collections::HashSet<&[u8]> =
            contents.iter().map(|c| &c[..]).collect();
        distinct.remove(&[0u8; PAGE_SIZE][..]);
        assert_eq!(s.stats().unique_pages as usize, distinct.len());
        // The slots given back are used again before new ones.
        let before = s.refs.len();
        let again = s.reserve(5);
        assert_eq!(s.refs.len(), before, "reused {again:?}");
        s.unreserve(&again);
    }

    #[test]
    fn dedups_and_frees() {
        let mut s = PageStore::new(true);
        let a = s.intern(&page(1));
        let b = s.intern(&page(2));
        let a2 = s.intern(&page(1));
        let z = s.intern(&ZERO_PAGE);
        assert_eq!(a, a2);
        assert_ne!(a, b);
        assert!(z.is_zero());
        let st = s.stats();
        assert_eq!(
            (st.unique_pages, st.referenced_pages, st.zero_pages),
            (2, 3, 1)
        );
        assert_eq!(st.bytes_saved, 2 * PAGE_SIZE as u64);
        assert_eq!(s.page(a), &page(1)[..]);
        s.decref(a);
        assert_eq!(s.stats().unique_pages, 2);
        s.decref(a);
        assert_eq!(s.stats().unique_pages, 1);
        // The freed slot is reused and holds the new content.
        let c = s.intern(&page(3));
        assert_eq!(c, a);
        assert_eq!(s.page(c), &page(3)[..]);
        assert_eq!(s.page(b), &page(2)[..]);
    }

    #[test]
    fn verify_keeps_colliding_pages_apart() {
        // With a 4-bit digest, 200 distinct pages collide constantly.
        let mut s = PageStore::with_weak_digest(true);
        let pages: Vec<Vec<u8>> = (1..=200).map(page).collect();
        let ids: Vec<PageId> = pages.iter().map(|p| s.intern(p)).collect();
        assert_eq!(s.stats().unique_pages, 200);
        assert!(s.stats().digest_collisions > 0);
        for (p, id) in pages.iter().zip(&ids) {
            assert_eq!(s.page(*id), &p[..]);
            assert_eq!(s.intern(p), *id, "re-interning finds the same page");
        }
        // Free half, in an order that removes index heads and collided entries.
        for id in ids.iter().step_by(2) {
            s.decref(*id);
            s.decref(*id);
        }
        for (i, p) in pages.iter().enumerate() {
            if i % 2 == 1 {
                assert_eq!(s.page(ids[i]), &p[..]);
                assert_eq!(s.intern(p), ids[i]);
            } else {
                let id = s.intern(p);
                assert_eq!(s.page(id), &p[..]);
            }
        }
    }

    #[test]
    fn without_verify_the_digest_decides() {
        let mut s = PageStore::with_weak_digest(false);
        let pages: Vec<Vec<u8>> = (1..=100).map(page).collect();
        for p in &pages {
            s.intern(p);
        }
        assert!(s.stats().unique_pages <= 16, "only 16 digests exist");
    }
}
