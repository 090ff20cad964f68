//! The durable snapshot store: snapshots saved to a directory, each distinct
//! page stored once across all of them, compressed, checksummed.
//!
//! # Format, version 5
//!
//! All integers are little-endian. A store is a directory (mode 0700; every
//! file 0600: it holds raw process memory) holding:
//!
//! * `STORE` — the text `pagewise-store 5\n`: marks the directory and names
//!   the format version. A reader refuses any other version but 2, 3 and
//!   4, which it reads as they are (format N only adds index version N);
//!   the first writer of an older store makes it format 5.
//! * `pages.pack` — a 32-byte header (`PWPACK\0\0`, `u32` version = 2,
//!   `u32` 0, the 16-byte store identity) followed by page records, appended
//!   only. A record is a 48-byte header then its payload:
//!
//!   | offset | size | field |
//!   |---|---|---|
//!   | 0 | 4 | magic `0x4b504750` (`PGPK`) |
//!   | 4 | 1 | encoding: 0 raw, 1 LZ4 block |
//!   | 5 | 3 | zero |
//!   | 8 | 4 | payload length in bytes (≤ 4096) |
//!   | 12 | 4 | zero |
//!   | 16 | 16 | xxh3-128 digest of the 4096 uncompressed bytes |
//!   | 32 | 8 | checksum: xxh3-64 of the payload, seeded with the xxh3-64 of bytes 0..32 |
//!   | 40 | 8 | zero |
//!
//!   The zero page is never stored.
//! * `snap-NNNNNNNNNN.idx` — one per snapshot (`N`: its id, decimal, ten
//!   digits): a 64-byte header (`PWSNAP\0\0`; `u32` version = 5 (2, 3
//!   and 4 are read too); `u32` region count; `u64` id; `u64` creation time, ms since
//!   the Unix epoch; `i64` source pid or 0; `u32` label length; `u32`
//!   process record length, 0 in version 2; the 16-byte store identity), the
//!   label (UTF-8), the process record of a snapshot of another process
//!   (its layout, program break, threads and start time; from version 4
//!   its descriptor table: [`ProcessRecord`]), the regions (`u64` start, `u64` length
//!   each), the pages of the regions in order, and last a `u64` xxh3-64
//!   checksum of every byte before it. Each page is a `u64`, the offset
//!   of its record in `pages.pack`, except zero pages: from version 5, a
//!   run of `n` of them (n ≥ 1) is one `u64`, `2^63 | n` (a sparse
//!   mapping's index costs what its data does: 10 GiB with 2 pages
//!   written is a few words, not 20 MiB); up to version 4, each is a
//!   `u64` 0.
//! * `MANIFEST` — what the store holds: a 48-byte header (`PWMANIF\0`;
//!   `u32` version = 2; `u32` snapshot count; the 16-byte store identity;
//!   `u64` committed length of the pack; `u64` the next snapshot id), one
//!   24-byte entry per snapshot (`u64` id, `u64` length and `u64` checksum
//!   of its index file), and last a `u64` xxh3-64 checksum of every byte
//!   before it.
//! * `LOCK` — held (`flock`) by the one process writing the store.
//!
//! # Safety of the data
//!
//! A reader checks every checksum, the digest of every decompressed page and
//! every length and offset against the file sizes; anything wrong is an
//! [`pagewise_mech::Error::Corrupt`] naming the file, never wrong data. Every file carries
//! the store's identity: a pack or an index copied from another store is an
//! error. The manifest names every snapshot, with the length and checksum of
//! its index, and the id inside an index must be the one in its name: a
//! missing, extra, renamed or swapped index is an error. Store files are
//! opened only if they are regular files (a FIFO in their place is an error,
//! not a wait).
//!
//! Saving is crash-safe: the new records are appended to the pack and synced
//! first; the index and then the new manifest are written to temporary
//! files and synced, and renamed into place in that order (then the
//! directory is synced). The manifest's rename is the commit. A save
//! interrupted at any point leaves every earlier snapshot loadable: at worst
//! the pack holds bytes past its committed length, and the directory the
//! index of the snapshot that was being saved (the manifest's next id);
//! readers ignore both, the next writer removes them. Damage to the
//! committed part of the pack is never "repaired": the writer refuses to
//! append to it. One process writes a store at a time.

mod files;
mod format;
mod open;
#[cfg(target_arch = "x86_64")]
mod record;
mod writer;

pub use crate::error::StoreError;
use files::*;
use format::*;
#[cfg(target_arch = "x86_64")]
pub use record::ProcessRecord;
pub use writer::SnapshotWriter;

use crate::{Error, Result};
use pagewise_mech::hash::{checksum, page_digest, zero_page_digest, PageDigest, ZERO_PAGE};
use pagewise_mech::region::push_coalesced;
use pagewise_mech::{PageRange, Region, PAGE_SIZE};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const STORE_FILE: &str = "STORE";
const STORE_TEXT: &str = "pagewise-store 5\n";
/// Formats 2, 3 and 4, read as they are and upgraded to 5 by the first
/// writer (format N only adds index version N).
const STORE_TEXT_OLD: [&str; 3] = [
    "pagewise-store 2\n",
    "pagewise-store 3\n",
    "pagewise-store 4\n",
];
const PACK_FILE: &str = "pages.pack";
const MANIFEST_FILE: &str = "MANIFEST";
const LOCK_FILE: &str = "LOCK";
const PACK_MAGIC: &[u8; 8] = b"PWPACK\0\0";
const PACK_HEADER: u64 = 32;
const MANIFEST_MAGIC: &[u8; 8] = b"PWMANIF\0";
const MANIFEST_HEADER: usize = 48;
const REC_MAGIC: u32 = 0x4b50_4750;
const REC_HEADER: usize = 48;
const SNAP_MAGIC: &[u8; 8] = b"PWSNAP\0\0";
const SNAP_HEADER: usize = 64;
const VERSION: u32 = 2;
/// The version of the indices written (2, 3 and 4 are read too).
const INDEX_VERSION: u32 = 5;
/// In an index of version 5, the mark of a word that stands for a run of
/// zero pages (its low bits: how many).
const ZERO_RUN: u64 = 1 << 63;
/// Longest process record read.
const MAX_RECORD: usize = 64 << 20;
/// Most snapshots a manifest may list when reading.
const MAX_SNAPSHOTS: usize = 1 << 24;
/// A store's identity, in every one of its files.
type StoreId = [u8; 16];
/// Largest label accepted.
const MAX_LABEL: usize = 4096;
/// Largest snapshot accepted when reading (2^32 pages: 16 TiB).
const MAX_PAGES: u64 = 1 << 32;

/// A snapshot as saved in a store.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct DiskSnapshot {
    /// Its id in the store.
    pub id: u64,
    /// When it was saved, ms since the Unix epoch.
    pub created_ms: u64,
    /// The process it was taken from, if another one.
    pub pid: Option<i32>,
    /// Free text given when saving.
    pub label: String,
    /// Regions, in the order their pages are listed.
    pub regions: Vec<Region>,
    /// Per page: offset of its record in the pack, 0 for a zero page.
    #[serde(skip)]
    pub entries: Vec<u64>,
    /// The indexes in `entries` of the pages stored (not zero), ascending:
    /// what a sparse snapshot holds, found without reading its holes.
    #[serde(skip)]
    pub(crate) stored: Vec<usize>,
    /// Size of the index file.
    pub index_bytes: u64,
    /// The process record of a snapshot of another process (index
    /// version 3), checked when read; empty otherwise.
    #[serde(skip)]
    pub record: Vec<u8>,
}

impl DiskSnapshot {
    /// Index of the first page of region `r` in the entries, when the
    /// snapshot has exactly that region.
    pub(crate) fn first_page_of(&self, r: &Region) -> Option<usize> {
        let mut first = 0usize;
        for pr in &self.regions {
            if pr == r {
                return Some(first);
            }
            first += pr.pages() as usize;
        }
        None
    }

    /// Pages it covers.
    pub fn pages(&self) -> u64 {
        self.entries.len() as u64
    }

    /// Zero pages among them.
    pub fn zero_pages(&self) -> u64 {
        self.pages() - self.stored.len() as u64
    }

    /// `(region index, address)` of page `i` of the entries.
    pub fn address_of(&self, mut i: u64) -> Option<u64> {
        for r in &self.regions {
            if i < r.pages() {
                return Some(r.start + i * PAGE_SIZE as u64);
            }
            i -= r.pages();
        }
        None
    }
}

/// What a store holds, as `pagewise snapshot inspect` shows it.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct DiskStats {
    /// Snapshots in the store.
    pub snapshots: u64,
    /// Distinct non-zero pages referenced by the snapshots.
    pub unique_pages: u64,
    /// Zero-page entries over all snapshots.
    pub zero_pages: u64,
    /// Non-zero page entries over all snapshots: references to stored
    /// pages (zero pages are counted apart, in `zero_pages`).
    pub referenced_pages: u64,
    /// Bytes of every file of the store.
    pub bytes_on_disk: u64,
    /// Bytes of the pack file.
    pub pack_bytes: u64,
    /// Bytes the snapshots stand for (every page, zero pages included).
    pub bytes_represented: u64,
    /// `bytes_represented / bytes_on_disk`.
    pub dedup_ratio: f64,
}

/// What one save wrote.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct SaveStats {
    /// Id of the new snapshot.
    pub id: u64,
    /// Pages in it.
    pub pages: u64,
    /// Pages new to the store (records appended).
    pub pages_new: u64,
    /// Zero pages.
    pub zero_pages: u64,
    /// Bytes appended to the pack.
    pub pack_bytes: u64,
    /// Bytes of the index file.
    pub index_bytes: u64,
}

/// A snapshot store in a directory.
#[derive(Debug)]
pub struct DiskStore {
    dir: PathBuf,
    pack: File,
    /// Length of the pack in use: the committed length, and while a writer
    /// appends, what it appended (records past it are ignored and overwritten).
    pack_len: u64,
    manifest: Manifest,
    /// Held while the store is open for writing.
    _lock: Option<File>,
    /// Digest → offsets of records with that digest (more than one only after
    /// a digest collision). Only built for writing.
    index: HashMap<PageDigest, Vec<u64>>,
    /// The pack's length when the save in progress (or given up) began.
    saving_from: Option<u64>,
    writable: bool,
    verify: bool,
}

impl DiskStore {
    /// Ids of the saved snapshots, ascending.
    pub fn ids(&self) -> Result<Vec<u64>> {
        Ok(self.manifest.entries.iter().map(|e| e.0).collect())
    }

    fn index_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("snap-{id:010}.idx"))
    }

    /// Reads and checks the index of snapshot `id`.
    pub fn load(&self, id: u64) -> Result<DiskSnapshot> {
        let Some((len, sum)) = self.manifest.entry(id) else {
            return Err(StoreError::NoSnapshot {
                store: self.dir.clone(),
                id,
            }
            .into());
        };
        let path = self.index_path(id);
        let bytes = match read_regular(&path) {
            Err(Error::Mech(pagewise_mech::Error::Os { source, .. }))
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Err(corrupt(
                    &path,
                    format!("snapshot {id}'s index file is missing"),
                ))
            }
            r => r?,
        };
        if bytes.len() as u64 != len || checksum(&bytes) != sum {
            return Err(corrupt(
                &path,
                "the index is not the one the manifest lists",
            ));
        }
        let s = parse_index(&path, &bytes, self.pack_len, &self.manifest.store_id)?;
        if s.id != id {
            return Err(corrupt(
                &path,
                format!("the index is that of snapshot {}, not {id}", s.id),
            ));
        }
        Ok(s)
    }

    /// All snapshots, ascending by id.
    pub fn list(&self) -> Result<Vec<DiskSnapshot>> {
        self.ids()?.into_iter().map(|id| self.load(id)).collect()
    }

    /// Reads the page whose record is at `offset` (0: the zero page) into
    /// `out`, checking its checksum and digest.
    pub fn read_page(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_record(offset, out, true)
    }

    /// [`DiskStore::read_page`] for a comparison with a page at hand,
    /// which checks the bytes whole: neither checksum nor digest (a
    /// record damaged since it was written compares unequal, or fails to
    /// decompress).
    pub(super) fn read_page_to_compare(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        self.read_record(offset, out, false)
    }

    fn read_record(&self, offset: u64, out: &mut [u8], checked: bool) -> Result<()> {
        assert_eq!(out.len(), PAGE_SIZE);
        if offset == 0 {
            out.fill(0);
            return Ok(());
        }
        let path = self.dir.join(PACK_FILE);
        let mut buf = [0u8; REC_HEADER + PAGE_SIZE];
        if offset < PACK_HEADER || offset + REC_HEADER as u64 > self.pack_len {
            return Err(corrupt(
                &path,
                format!("record offset {offset} is outside the pack"),
            ));
        }
        let read = |buf: &mut [u8], at: u64| {
            self.pack
                .read_exact_at(buf, at)
                .map_err(|e| match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => {
                        corrupt(&path, format!("the record at offset {offset} is truncated"))
                    }
                    _ => io(&path, "reading", e),
                })
        };
        // One read of the longest record that fits (a page's record is
        // rarely followed by less than a page), a second only for the rest.
        // What a writer appended may not all be in the file yet: a short
        // first read is fine if it holds the header.
        let want = (REC_HEADER + PAGE_SIZE).min((self.pack_len - offset) as usize);
        let first = read_up_to(&self.pack, &mut buf[..want], offset)
            .map_err(|e| io(&path, "reading", e))?;
        if first < REC_HEADER {
            return Err(corrupt(
                &path,
                format!("the record at offset {offset} is truncated"),
            ));
        }
        let len = u32_at(&buf, 8) as usize;
        if u32_at(&buf, 0) != REC_MAGIC
            || len > PAGE_SIZE
            || offset + (REC_HEADER + len) as u64 > self.pack_len
        {
            return Err(corrupt(&path, format!("bad record at offset {offset}")));
        }
        if REC_HEADER + len > first {
            read(&mut buf[first..REC_HEADER + len], offset + first as u64)?;
        }
        self.decode_record(offset, &buf[..REC_HEADER + len], out, checked)
    }

    /// The length of the record at `offset` whose first bytes are
    /// `bytes`, if they hold its header and it is one: the header, then
    /// the payload.
    pub(super) fn record_len(&self, offset: u64, bytes: &[u8]) -> Option<usize> {
        if bytes.len() < REC_HEADER || u32_at(bytes, 0) != REC_MAGIC {
            return None;
        }
        let len = u32_at(bytes, 8) as usize;
        (len <= PAGE_SIZE && offset + (REC_HEADER + len) as u64 <= self.pack_len)
            .then_some(REC_HEADER + len)
    }

    /// Decodes the record at `offset`, whole in `rec` (its header and
    /// payload), into `out`; with `checked`, checking its checksum and
    /// digest.
    pub(super) fn decode_record(
        &self,
        offset: u64,
        rec: &[u8],
        out: &mut [u8],
        checked: bool,
    ) -> Result<()> {
        let path = || self.dir.join(PACK_FILE);
        let (header, payload) = rec.split_at(REC_HEADER);
        let len = payload.len();
        if checked && record_checksum(header, payload) != u64_at(header, 32) {
            return Err(corrupt(
                &path(),
                format!("checksum mismatch in the record at offset {offset}"),
            ));
        }
        match header[4] {
            0 if len == PAGE_SIZE => out.copy_from_slice(payload),
            1 => match lz4_flex::block::decompress_into(payload, out) {
                Ok(PAGE_SIZE) => {}
                _ => {
                    return Err(corrupt(
                        &path(),
                        format!("the record at offset {offset} does not decompress to a page"),
                    ))
                }
            },
            _ => {
                return Err(corrupt(
                    &path(),
                    format!("unknown encoding in the record at offset {offset}"),
                ))
            }
        }
        let digest = u128::from_le_bytes(header[16..32].try_into().expect("16 bytes"));
        if checked && page_digest(out) != digest {
            return Err(corrupt(
                &path(),
                format!("the page at offset {offset} does not match its digest"),
            ));
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes of the pack at `at` or as many as there
    /// are; returns how many.
    pub(super) fn read_pack(&self, buf: &mut [u8], at: u64) -> Result<usize> {
        read_up_to(&self.pack, buf, at).map_err(|e| io(&self.dir.join(PACK_FILE), "reading", e))
    }
}

impl DiskStore {
    /// Statistics over every snapshot in the store.
    pub fn stats(&self) -> Result<DiskStats> {
        self.stats_of(&self.list()?)
    }

    /// Statistics over `list`, the store's snapshots as [`DiskStore::list`]
    /// returned them (for callers that already hold it).
    pub fn stats_of(&self, list: &[DiskSnapshot]) -> Result<DiskStats> {
        let mut st = DiskStats::default();
        let mut seen = std::collections::HashSet::new();
        for s in list {
            st.snapshots += 1;
            st.zero_pages += s.zero_pages();
            st.referenced_pages += s.stored.len() as u64;
            seen.extend(s.stored.iter().map(|&i| s.entries[i]));
            st.bytes_represented += s.pages() * PAGE_SIZE as u64;
        }
        st.unique_pages = seen.len() as u64;
        for e in fs::read_dir(&self.dir).map_err(|e| io(&self.dir, "reading", e))? {
            let e = e.map_err(|e| io(&self.dir, "reading", e))?;
            let len = e
                .metadata()
                .map_err(|er| io(&e.path(), "reading", er))?
                .len();
            st.bytes_on_disk += len;
            if e.file_name() == PACK_FILE {
                st.pack_bytes = len;
            }
        }
        st.dedup_ratio = if st.bytes_on_disk > 0 {
            st.bytes_represented as f64 / st.bytes_on_disk as f64
        } else {
            0.0
        };
        Ok(st)
    }

    /// Page ranges whose contents differ between snapshots `a` and `b`
    /// (compared by address; a page present in one only counts as differing).
    pub fn diff(&self, a: u64, b: u64) -> Result<Vec<PageRange>> {
        let (sa, sb) = (self.load(a)?, self.load(b)?);
        let pages_b: HashMap<u64, u64> = (0..sb.pages())
            .map(|i| (sb.address_of(i).expect("in range"), sb.entries[i as usize]))
            .collect();
        let mut addrs: Vec<(u64, Option<u64>, Option<u64>)> = Vec::new();
        for i in 0..sa.pages() {
            let addr = sa.address_of(i).expect("in range");
            addrs.push((
                addr,
                Some(sa.entries[i as usize]),
                pages_b.get(&addr).copied(),
            ));
        }
        let in_a: std::collections::HashSet<u64> = addrs.iter().map(|x| x.0).collect();
        for i in 0..sb.pages() {
            let addr = sb.address_of(i).expect("in range");
            if !in_a.contains(&addr) {
                addrs.push((addr, None, Some(sb.entries[i as usize])));
            }
        }
        addrs.sort_unstable();
        let (mut pa, mut pb) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
        let mut out = Vec::new();
        for (addr, ea, eb) in addrs {
            let differs = match (ea, eb) {
                (Some(x), Some(y)) if x == y => false,
                (Some(x), Some(y)) => {
                    // Two records may hold equal pages (after a digest collision).
                    self.read_page(x, &mut pa)?;
                    self.read_page(y, &mut pb)?;
                    pa != pb
                }
                _ => true,
            };
            if differs {
                push_coalesced(&mut out, addr, addr + PAGE_SIZE as u64);
            }
        }
        Ok(out)
    }

    /// Restores snapshot `id` into memory of the calling process: region `i`
    /// of the snapshot goes to `dest[i]`, which must have the same size.
    ///
    /// # Safety
    /// Each `dest` region must be mapped, writable, and hold no data that Rust
    /// code borrows while this runs.
    pub unsafe fn restore_into(&self, id: u64, dest: &[Region]) -> Result<()> {
        let s = self.load(id)?;
        check_same_shape(&s, dest)?;
        let mut page = vec![0u8; PAGE_SIZE];
        let mut i = 0usize;
        for d in dest {
            for p in 0..d.pages() {
                self.read_page(s.entries[i], &mut page)?;
                // SAFETY: the caller guarantees `d` is mapped and writable and
                // not borrowed; `p` is inside it.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        page.as_ptr(),
                        (d.start + p * PAGE_SIZE as u64) as *mut u8,
                        PAGE_SIZE,
                    )
                };
                i += 1;
            }
        }
        Ok(())
    }
}

/// Reads from `at` into `buf` until it is full or the file ends; the
/// bytes read.
fn read_up_to(f: &File, buf: &mut [u8], at: u64) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Checks that `dest` has the shape (region count and sizes) of snapshot `s`.
pub(crate) fn check_same_shape(s: &DiskSnapshot, dest: &[Region]) -> Result<()> {
    let ok =
        s.regions.len() == dest.len() && s.regions.iter().zip(dest).all(|(a, b)| a.len == b.len);
    if ok {
        Ok(())
    } else {
        let sizes: Vec<u64> = s.regions.iter().map(|r| r.len).collect();
        let want: Vec<u64> = dest.iter().map(|r| r.len).collect();
        Err(StoreError::ShapeMismatch {
            id: s.id,
            sizes,
            want,
        }
        .into())
    }
}
