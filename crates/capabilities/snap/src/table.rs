//! Snapshot tables: a region's page ids in chunks of [`CHUNK_PAGES`]
//! shared between snapshots (copy on write), and the page references they
//! hold in the [`PageStore`].

use super::disk::SnapshotWriter;
use super::{DiskSnapshot, DiskStore, PageId, PageStore, TakeStats, CHUNK_PAGES};
use crate::Result;
use pagewise_mech::PAGE_SIZE;
use std::sync::Arc;

pub(super) type Chunk = Arc<Vec<PageId>>;

/// Page ids of one region, in chunks.
#[derive(Clone, Debug)]
pub(super) struct Table {
    pub(super) chunks: Vec<Chunk>,
}

impl Table {
    /// A table of fresh chunks holding `ids` (whose references the caller took).
    pub(super) fn from_ids(ids: &[PageId]) -> Self {
        Table {
            chunks: ids
                .chunks(CHUNK_PAGES)
                .map(|c| Arc::new(c.to_vec()))
                .collect(),
        }
    }

    pub(super) fn get(&self, page: usize) -> PageId {
        self.chunks[page / CHUNK_PAGES][page % CHUNK_PAGES]
    }
}

/// Makes chunk `c` of `table` private to it (copying it and taking
/// references on its pages in `store` if it is shared) and returns it.
pub(super) fn own_chunk<'t>(
    store: &mut PageStore,
    table: &'t mut Table,
    c: usize,
) -> &'t mut Vec<PageId> {
    let chunk = &mut table.chunks[c];
    if Arc::get_mut(chunk).is_none() {
        for &id in chunk.iter() {
            store.incref(id);
        }
        *chunk = Arc::new(chunk.as_ref().clone());
    }
    Arc::get_mut(chunk).expect("just made unique")
}

/// Drops the references of tables about to be dropped: a chunk's pages lose
/// a reference when its last holder goes. Their chunk lists go to `spare`.
pub(super) fn release(store: &mut PageStore, spare: &mut Vec<Vec<Chunk>>, tables: Vec<Table>) {
    for mut t in tables {
        for chunk in t.chunks.drain(..) {
            if let Some(ids) = Arc::into_inner(chunk) {
                for id in ids {
                    store.decref(id);
                }
            }
        }
        spare.push(t.chunks);
    }
}

/// Another holder of the chunks of `tables` (no page reference changes).
/// Chunk lists come from `spare`, a pool of empty ones: a snapshot of a large
/// region allocates no memory in the steady state.
pub(super) fn share(spare: &mut Vec<Vec<Chunk>>, tables: &[Table]) -> Vec<Table> {
    tables
        .iter()
        .map(|t| {
            let mut chunks = spare.pop().unwrap_or_default();
            chunks.extend(t.chunks.iter().cloned());
            Table { chunks }
        })
        .collect()
}

/// The pages of `tgt` that memory must be given, in order: those marked
/// in `marks` (written since), and those whose id differs from `cur`'s
/// (what memory held; `None`: not known, every page). A chunk `cur` shares
/// with `tgt` and with no mark is skipped whole.
pub(super) fn pages_to_write(
    cur: Option<&Table>,
    tgt: &Table,
    marks: &[u64],
    mut out: impl FnMut(usize, PageId),
) {
    for (c, chunk) in tgt.chunks.iter().enumerate() {
        let base = c * CHUNK_PAGES;
        let same = cur.is_some_and(|t| Arc::ptr_eq(&t.chunks[c], chunk));
        let any = marks[base / 64..(base + chunk.len()).div_ceil(64)]
            .iter()
            .any(|&w| w != 0);
        if same && !any {
            continue;
        }
        for (k, &want) in chunk.iter().enumerate() {
            let i = base + k;
            let differs = match cur {
                Some(t) => !same && t.chunks[c][k] != want,
                None => true,
            };
            if differs || get_bit(marks, i) {
                out(i, want);
            }
        }
    }
}

/// Sets in `bits` (a bit per page of region `r`) the pages of `ranges`
/// that lie in `r`.
pub(super) fn mark(
    bits: &mut [u64],
    r: pagewise_mech::Region,
    ranges: &[pagewise_mech::PageRange],
) {
    for d in ranges {
        let (a, b) = (d.start.max(r.start), d.end().min(r.end()));
        let mut addr = a;
        while addr < b {
            set_bit(bits, ((addr - r.start) / PAGE_SIZE as u64) as usize);
            addr += PAGE_SIZE as u64;
        }
    }
}

pub(super) fn set_bit(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

pub(super) fn get_bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}

/// The tables of stored snapshot `ds` of `disk`, one per region, its
/// pages interned in `store` (each record read once); pages read and new
/// are counted in `stats`. A chunk of zero pages alone is one chunk shared
/// by every such place (a sparse mapping's holes cost no memory).
pub(super) fn from_disk(
    store: &mut PageStore,
    disk: &DiskStore,
    ds: &DiskSnapshot,
    stats: &mut TakeStats,
) -> Result<Vec<Table>> {
    let mut seen: std::collections::HashMap<u64, PageId> = std::collections::HashMap::new();
    let mut buf = vec![0u8; PAGE_SIZE];
    let mut tables = Vec::with_capacity(ds.regions.len());
    let mut zeros: Option<Chunk> = None;
    let mut at = 0usize;
    for r in &ds.regions {
        let n = r.pages() as usize;
        // The reader checked that the entries fill the regions.
        let Some(entries) = ds.entries.get(at..at + n) else {
            return Err(crate::Error::Internal {
                what: "a stored snapshot's entries do not fill its regions",
            });
        };
        let mut chunks = Vec::with_capacity(n.div_ceil(CHUNK_PAGES));
        // The stored pages' indexes say which chunks are all zero pages,
        // without reading a sparse snapshot's holes.
        let mut next = ds.stored.partition_point(|&i| i < at);
        for (c, part) in entries.chunks(CHUNK_PAGES).enumerate() {
            let end = at + c * CHUNK_PAGES + part.len();
            let empty = ds.stored.get(next).is_none_or(|&i| i >= end);
            next = ds.stored.partition_point(|&i| i < end);
            if part.len() == CHUNK_PAGES && empty {
                let z = zeros.get_or_insert_with(|| {
                    for _ in 0..CHUNK_PAGES {
                        store.incref(PageId::ZERO);
                    }
                    Arc::new(vec![PageId::ZERO; CHUNK_PAGES])
                });
                chunks.push(Arc::clone(z));
                continue;
            }
            let mut ids = Vec::with_capacity(part.len());
            for &e in part {
                let id = if e == 0 {
                    PageId::ZERO
                } else if let Some(&id) = seen.get(&e) {
                    id
                } else {
                    disk.read_page(e, &mut buf)?;
                    let id = store.intern(&buf);
                    // Interned with its reference: the one of this place.
                    stats.pages_read += 1;
                    if !id.is_zero() && store.refs(id) == 1 {
                        stats.pages_new += 1;
                    }
                    seen.insert(e, id);
                    ids.push(id);
                    continue;
                };
                store.incref(id);
                ids.push(id);
            }
            chunks.push(Arc::new(ids));
        }
        at += n;
        tables.push(Table { chunks });
    }
    Ok(tables)
}

/// Pushes the pages of `tables` from `store` into a store's writer, in
/// order (their digests known: not computed again).
pub(super) fn push_pages(
    w: &mut SnapshotWriter<'_>,
    store: &PageStore,
    tables: &[Table],
) -> Result<()> {
    for t in tables {
        for chunk in &t.chunks {
            for &p in chunk.iter() {
                if p.is_zero() {
                    w.push_zeros(1)?;
                } else {
                    w.push_digested(store.page(p), store.digest_of(p))?;
                }
            }
        }
    }
    Ok(())
}
