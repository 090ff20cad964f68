//! Saving a snapshot: pages pushed in order, each distinct content stored
//! once (digest first, then the bytes compared), made visible only by
//! [`SnapshotWriter::finish`].

use super::*;

impl DiskStore {
    /// Starts saving a snapshot of `regions`: push its pages in order, then finish.
    pub fn writer(
        &mut self,
        regions: &[Region],
        pid: Option<i32>,
        label: &str,
    ) -> Result<SnapshotWriter<'_>> {
        if !self.writable {
            return Err(StoreError::ReadOnly {
                store: self.dir.clone(),
            }
            .into());
        }
        if label.len() > MAX_LABEL {
            return Err(StoreError::LabelTooLong { max: MAX_LABEL }.into());
        }
        // A save given up (a peer that broke off, an error) leaves the
        // store as it was: its records are neither referenced by this
        // save nor kept (this one writes over them).
        if let Some(start) = self.saving_from.take() {
            self.pack_len = start;
            self.index.retain(|_, offs| {
                offs.retain(|&o| o < start);
                !offs.is_empty()
            });
        }
        self.saving_from = Some(self.pack_len);
        let id = self.manifest.next_id;
        if id == u64::MAX {
            return Err(StoreError::IdsExhausted {
                store: self.dir.clone(),
            }
            .into());
        }
        let pages: u64 = regions.iter().map(Region::pages).sum();
        let pack_path = self.dir.join(PACK_FILE);
        let mut out = BufWriter::with_capacity(
            1 << 20,
            self.pack
                .try_clone()
                .map_err(|e| io(&pack_path, "opening", e))?,
        );
        std::io::Seek::seek(&mut out, std::io::SeekFrom::Start(self.pack_len))
            .map_err(|e| io(&pack_path, "seeking in", e))?;
        let flushed = self.pack_len;
        Ok(SnapshotWriter {
            store: self,
            out,
            id,
            regions: regions.to_vec(),
            pid,
            label: label.to_string(),
            entries: Runs::default(),
            pages,
            stats: SaveStats::default(),
            compressed: vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE_SIZE)],
            check: vec![0u8; PAGE_SIZE],
            recent: RecordCache::new(),
            window: Vec::new(),
            window_at: 0,
            flushed,
            record: Vec::new(),
        })
    }

    /// Saves the copy of a process's memory (its regions sorted by address,
    /// each with its bytes) as one snapshot. With `since = Some((prev,
    /// changed))`, the pages of a region `prev` also has, at the same place
    /// and size, are taken over from `prev` unless they lie in `changed`
    /// (sorted, coalesced): they are neither hashed nor looked up.
    pub fn save(
        &mut self,
        regions: &[(Region, Vec<u8>)],
        pid: Option<i32>,
        label: &str,
        since: Option<(&DiskSnapshot, &[PageRange])>,
    ) -> Result<SaveStats> {
        // Without `prev`, every region is pushed whole: `changed` unused.
        let (prev, changed) = since.map_or((None, &[][..]), |(p, c)| (Some(p), c));
        self.save_with(regions, pid, label, prev, changed, false)
    }

    /// As [`DiskStore::save`] with `since = (prev, changed)`, where a
    /// region `prev` lacks (every region without `prev`) holds zeros
    /// outside `changed`: a copy that read only what memory held of a
    /// sparse mapping is saved at the cost of that, neither its holes
    /// hashed nor a page of them touched.
    pub(crate) fn save_changed(
        &mut self,
        regions: &[(Region, Vec<u8>)],
        pid: Option<i32>,
        label: &str,
        prev: Option<&DiskSnapshot>,
        changed: &[PageRange],
    ) -> Result<SaveStats> {
        self.save_with(regions, pid, label, prev, changed, true)
    }

    fn save_with(
        &mut self,
        regions: &[(Region, Vec<u8>)],
        pid: Option<i32>,
        label: &str,
        prev: Option<&DiskSnapshot>,
        changed: &[PageRange],
        zeros_elsewhere: bool,
    ) -> Result<SaveStats> {
        let order: Vec<Region> = regions.iter().map(|(r, _)| *r).collect();
        let mut w = self.writer(&order, pid, label)?;
        for (r, buf) in regions {
            let first = prev.and_then(|p| p.first_page_of(r).map(|i| (p, i)));
            if first.is_none() && !zeros_elsewhere {
                for page in buf.chunks_exact(PAGE_SIZE) {
                    w.push(page)?;
                }
                continue;
            }
            // The changed ranges that meet this region, in order; the
            // pages between them from `prev`, or zeros.
            let index = |addr: u64| ((addr - r.start) / PAGE_SIZE as u64) as usize;
            let mut at = r.start;
            let k = changed.partition_point(|c| c.end() <= r.start);
            let between = |w: &mut SnapshotWriter<'_>, from: u64, to: u64| match first {
                Some((p, i)) => {
                    (index(from)..index(to)).try_for_each(|k| w.push_unchanged(p, i + k))
                }
                None => w.push_zeros(index(to) as u64 - index(from) as u64),
            };
            for c in changed[k..].iter().take_while(|c| c.start < r.end()) {
                let (a, b) = (c.start.max(at), c.end().min(r.end()));
                if a >= b {
                    continue;
                }
                between(&mut w, at, a)?;
                for page in buf[index(a) * PAGE_SIZE..index(b) * PAGE_SIZE].chunks_exact(PAGE_SIZE)
                {
                    w.push(page)?;
                }
                at = b;
            }
            between(&mut w, at, r.end())?;
        }
        w.finish()
    }
}

/// Saves one snapshot: push every page of its regions in order, then [`SnapshotWriter::finish`].
/// Dropped without finishing, nothing becomes visible.
pub struct SnapshotWriter<'s> {
    store: &'s mut DiskStore,
    out: BufWriter<File>,
    id: u64,
    regions: Vec<Region>,
    pid: Option<i32>,
    label: String,
    entries: Runs,
    pages: u64,
    stats: SaveStats,
    compressed: Vec<u8>,
    check: Vec<u8>,
    /// Pack bytes below this offset have reached the file (not only the buffer).
    flushed: u64,
    recent: RecordCache,
    /// Pack bytes read ahead for comparisons, from `window_at`.
    window: Vec<u8>,
    window_at: u64,
    /// The process record (index version 3 and on), if any.
    record: Vec<u8>,
}

/// A snapshot's pages as an index of version 5 lists them: a word per
/// stored page (its record's offset), one per run of zero pages
/// ([`ZERO_RUN`] and how many).
#[derive(Default)]
struct Runs {
    words: Vec<u64>,
    /// Pages listed.
    count: u64,
}

impl Runs {
    fn push(&mut self, e: u64) {
        if e == 0 {
            self.zeros(1);
        } else {
            self.words.push(e);
            self.count += 1;
        }
    }

    fn zeros(&mut self, n: u64) {
        if n == 0 {
            return;
        }
        match self.words.last_mut() {
            Some(w) if *w & ZERO_RUN != 0 => *w += n,
            _ => self.words.push(ZERO_RUN | n),
        }
        self.count += n;
    }
}

/// Bytes of the pack a comparison reads ahead.
const WINDOW: usize = 32 << 10;

/// Contents of records this writer appended or read back, so that verifying
/// a page against a record it just saw needs no read (a process repeats a
/// few contents many times). Per writer: a record's offset names the same
/// contents only while the writer that saw it lives (an unfinished save's
/// records are overwritten later).
pub(super) struct RecordCache {
    offsets: Vec<u64>,
    pages: Vec<u8>,
}

impl RecordCache {
    const SLOTS: usize = 256;

    pub(super) fn new() -> Self {
        RecordCache {
            // Offset 0 is never a record (the pack header is there): an empty slot.
            offsets: vec![0; Self::SLOTS],
            pages: vec![0; Self::SLOTS * PAGE_SIZE],
        }
    }

    pub(super) fn slot(off: u64) -> usize {
        (off.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % Self::SLOTS
    }

    pub(super) fn get(&self, off: u64) -> Option<&[u8]> {
        let i = Self::slot(off);
        (self.offsets[i] == off).then(|| &self.pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
    }

    pub(super) fn put(&mut self, off: u64, page: &[u8]) {
        let i = Self::slot(off);
        self.offsets[i] = off;
        self.pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].copy_from_slice(page);
    }
}

impl std::fmt::Debug for SnapshotWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("id", &self.id)
            .field("pages", &self.entries.count)
            .finish()
    }
}

impl SnapshotWriter<'_> {
    /// Adds a region after those given to [`DiskStore::writer`], for a
    /// snapshot whose regions arrive with its pages (a CRIU dump's
    /// pagemap): its pages are pushed next. A region that starts where
    /// the last one ends extends it.
    pub(crate) fn add_region(&mut self, r: Region) {
        self.pages += r.pages();
        match self.regions.last_mut() {
            Some(last) if last.end() == r.start => last.len += r.len,
            _ => self.regions.push(r),
        }
    }

    /// Appends the next page (4096 bytes).
    pub fn push(&mut self, page: &[u8]) -> Result<()> {
        let digest = page_digest(page);
        self.push_digested(page, digest)
    }

    /// Appends the next page whose digest the caller computed.
    pub(crate) fn push_digested(&mut self, page: &[u8], digest: PageDigest) -> Result<()> {
        assert_eq!(page.len(), PAGE_SIZE);
        if self.entries.count >= self.pages {
            return Err(StoreError::TooManyPages.into());
        }
        if digest == zero_page_digest() && page == ZERO_PAGE {
            self.entries.push(0);
            self.stats.zero_pages += 1;
            return Ok(());
        }
        if let Some(offs) = self.store.index.get(&digest).cloned() {
            let mut found = None;
            for o in offs {
                if !self.store.verify || self.same_as_record(o, page)? {
                    found = Some(o);
                    break;
                }
            }
            if let Some(o) = found {
                self.entries.push(o);
                return Ok(());
            }
        }
        let off = self.append(page, digest)?;
        self.store.index.entry(digest).or_default().push(off);
        self.entries.push(off);
        self.stats.pages_new += 1;
        Ok(())
    }

    /// Appends, without reading it, page `i` of `prev`, an earlier snapshot
    /// of this store: the caller knows the page has not changed since (a
    /// dirty tracker said so). The new snapshot refers to the same record.
    pub(crate) fn push_unchanged(&mut self, prev: &DiskSnapshot, i: usize) -> Result<()> {
        if self.entries.count >= self.pages {
            return Err(StoreError::TooManyPages.into());
        }
        if !self.store.manifest.entries.iter().any(|e| e.0 == prev.id) {
            return Err(StoreError::NotInStore {
                store: self.store.dir.clone(),
                id: prev.id,
            }
            .into());
        }
        let e = *prev.entries.get(i).ok_or(Error::MissingPage {
            id: prev.id,
            page: i,
        })?;
        if e == 0 {
            self.stats.zero_pages += 1;
        }
        self.entries.push(e);
        Ok(())
    }

    /// Appends a run of `n` zero pages.
    pub(crate) fn push_zeros(&mut self, n: u64) -> Result<()> {
        if self.entries.count + n > self.pages {
            return Err(StoreError::TooManyPages.into());
        }
        self.entries.zeros(n);
        self.stats.zero_pages += n;
        Ok(())
    }

    pub(super) fn same_as_record(&mut self, off: u64, page: &[u8]) -> Result<bool> {
        if let Some(seen) = self.recent.get(off) {
            return Ok(seen == page);
        }
        if off >= self.flushed {
            let path = self.store.dir.join(PACK_FILE);
            self.out.flush().map_err(|e| io(&path, "writing", e))?;
            self.flushed = self.store.pack_len;
        }
        let mut check = std::mem::take(&mut self.check);
        // Compared whole: the record's own checks are not needed here.
        let r = self.read_to_compare(off, &mut check);
        let same = r.is_ok() && check == page;
        if r.is_ok() {
            self.recent.put(off, &check);
        }
        self.check = check;
        r.map(|_| same)
    }

    /// The record at `off` decoded into `out` for a comparison (see
    /// [`DiskStore::read_page_to_compare`]), through a window of the pack
    /// read ahead: the pages a dump sends again were mostly stored one
    /// after another, so one read serves many.
    fn read_to_compare(&mut self, off: u64, out: &mut [u8]) -> Result<()> {
        for fresh in [false, true] {
            if fresh {
                let upto =
                    (self.flushed.min(self.store.pack_len).saturating_sub(off)).min(WINDOW as u64);
                self.window.resize(upto as usize, 0);
                let n = self.store.read_pack(&mut self.window, off)?;
                self.window.truncate(n);
                self.window_at = off;
            }
            let Some(at) = off
                .checked_sub(self.window_at)
                .map(|d| d as usize)
                .filter(|&d| d < self.window.len())
            else {
                continue;
            };
            let bytes = &self.window[at..];
            if let Some(len) = self
                .store
                .record_len(off, bytes)
                .filter(|&l| l <= bytes.len())
            {
                return self.store.decode_record(off, &bytes[..len], out, false);
            }
        }
        self.store.read_page_to_compare(off, out)
    }

    pub(super) fn append(&mut self, page: &[u8], digest: PageDigest) -> Result<u64> {
        let n = lz4_flex::block::compress_into(page, &mut self.compressed).map_err(|_| {
            Error::Internal {
                what: "lz4 found its output buffer too small",
            }
        })?;
        let (enc, payload): (u8, &[u8]) = if n < PAGE_SIZE {
            (1, &self.compressed[..n])
        } else {
            (0, page)
        };
        let mut header = [0u8; REC_HEADER];
        header[0..4].copy_from_slice(&REC_MAGIC.to_le_bytes());
        header[4] = enc;
        header[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        header[16..32].copy_from_slice(&digest.to_le_bytes());
        let sum = record_checksum(&header, payload);
        header[32..40].copy_from_slice(&sum.to_le_bytes());
        let path = self.store.dir.join(PACK_FILE);
        self.out
            .write_all(&header)
            .and_then(|_| self.out.write_all(payload))
            .map_err(|e| io(&path, "writing", e))?;
        let off = self.store.pack_len;
        self.recent.put(off, page);
        self.store.pack_len += (REC_HEADER + payload.len()) as u64;
        self.stats.pack_bytes += (REC_HEADER + payload.len()) as u64;
        Ok(off)
    }

    /// Saves `r` with the snapshot: what a rollback of the process it was
    /// taken from needs besides its pages.
    #[cfg(target_arch = "x86_64")]
    pub fn process_record(&mut self, r: &ProcessRecord) {
        self.record = r.encode();
    }

    /// Makes the snapshot durable and visible; returns what was written.
    pub fn finish(mut self) -> Result<SaveStats> {
        if self.entries.count != self.pages {
            return Err(Error::PageCount {
                pushed: self.entries.count,
                expected: self.pages,
            });
        }
        let pack_path = self.store.dir.join(PACK_FILE);
        self.out.flush().map_err(|e| io(&pack_path, "writing", e))?;
        self.out
            .get_ref()
            .sync_data()
            .map_err(|e| io(&pack_path, "syncing", e))?;
        let mut b = Vec::with_capacity(SNAP_HEADER + self.entries.words.len() * 8 + 64);
        b.extend_from_slice(SNAP_MAGIC);
        b.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        b.extend_from_slice(&(self.regions.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        b.extend_from_slice(&now.to_le_bytes());
        b.extend_from_slice(&(self.pid.unwrap_or(0) as i64).to_le_bytes());
        b.extend_from_slice(&(self.label.len() as u32).to_le_bytes());
        b.extend_from_slice(&(self.record.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.store.manifest.store_id);
        b.extend_from_slice(self.label.as_bytes());
        b.extend_from_slice(&self.record);
        for r in &self.regions {
            b.extend_from_slice(&r.start.to_le_bytes());
            b.extend_from_slice(&r.len.to_le_bytes());
        }
        for w in &self.entries.words {
            b.extend_from_slice(&w.to_le_bytes());
        }
        let sum = checksum(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        let path = self.store.index_path(self.id);
        let tmp = path.with_extension("idx.tmp");
        write_synced(&tmp, &b)?;
        let mut manifest = self.store.manifest.clone();
        manifest
            .entries
            .push((self.id, b.len() as u64, checksum(&b)));
        manifest.pack_len = self.store.pack_len;
        manifest.next_id = self.id + 1;
        let mpath = self.store.dir.join(MANIFEST_FILE);
        let mtmp = mpath.with_extension("tmp");
        write_synced(&mtmp, &manifest.encode())?;
        fs::rename(&tmp, &path).map_err(|e| io(&path, "renaming into", e))?;
        // The commit.
        fs::rename(&mtmp, &mpath).map_err(|e| io(&mpath, "renaming into", e))?;
        sync_dir(&self.store.dir)?;
        self.store.manifest = manifest;
        self.store.saving_from = None;
        self.stats.id = self.id;
        self.stats.pages = self.pages;
        self.stats.index_bytes = b.len() as u64;
        Ok(self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 40 incompressible pages (each record about a page: a few per
    /// read-ahead window, so that comparisons cross window ends).
    fn pages() -> Vec<Vec<u8>> {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        (0..40)
            .map(|_| {
                (0..PAGE_SIZE / 8)
                    .flat_map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x.to_le_bytes()
                    })
                    .collect()
            })
            .collect()
    }

    /// With verification on, a page whose digest matches a stored one is
    /// compared byte for byte through the read-ahead window: the same
    /// pages saved again find every record; a page claiming another's
    /// digest with other bytes is stored anew, and reads back as itself.
    #[test]
    fn a_matching_digest_is_compared_byte_for_byte() {
        let dir = std::env::temp_dir().join(format!("pagewise-unit-verify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = DiskStore::create(&dir, true).unwrap();
        let r = Region::new(0x10000, 40 * PAGE_SIZE as u64).unwrap();
        let save = |store: &mut DiskStore, forge: bool| {
            let mut w = store.writer(&[r], None, "t").unwrap();
            for (i, p) in pages().iter().enumerate() {
                if forge && i % 3 == 0 {
                    // Another page's bytes under this page's digest.
                    let other = &pages()[(i + 1) % 40];
                    w.push_digested(other, page_digest(p)).unwrap();
                } else {
                    w.push(p).unwrap();
                }
            }
            w.finish().unwrap()
        };
        assert_eq!(save(&mut store, false).pages_new, 40);
        assert_eq!(save(&mut store, false).pages_new, 0, "every record found");
        let forged = save(&mut store, true);
        assert_eq!(forged.pages_new, 14, "each forged page stored anew");
        let snap = store.load(forged.id).unwrap();
        let mut out = vec![0u8; PAGE_SIZE];
        for (i, p) in pages().iter().enumerate() {
            let want = if i % 3 == 0 {
                &pages()[(i + 1) % 40]
            } else {
                p
            };
            store
                .read_page_to_compare(snap.entries[i], &mut out)
                .unwrap();
            assert_eq!(&out, want, "page {i}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
