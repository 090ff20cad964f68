//! Snapshot tables: a region's page ids in chunks of [`CHUNK_PAGES`]
//! shared between snapshots (copy on write), and the page references they
//! hold in the [`PageStore`].

use super::{PageId, PageStore, CHUNK_PAGES};
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

pub(super) fn set_bit(bits: &mut [u64], i: usize) {
    bits[i / 64] |= 1 << (i % 64);
}

pub(super) fn get_bit(bits: &[u64], i: usize) -> bool {
    bits[i / 64] & (1 << (i % 64)) != 0
}
