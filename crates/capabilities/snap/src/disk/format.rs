//! The store's byte formats (see the module docs of [`super`]): the
//! manifest, a snapshot's index, a record's checksum, and reading them back
//! with every field checked.

use super::*;

/// What the store holds (the `MANIFEST` file).
#[derive(Debug, Clone)]
pub(super) struct Manifest {
    pub(super) store_id: StoreId,
    /// Committed length of the pack.
    pub(super) pack_len: u64,
    pub(super) next_id: u64,
    /// `(id, index length, index checksum)`, ascending by id.
    pub(super) entries: Vec<(u64, u64, u64)>,
}

impl Manifest {
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(MANIFEST_HEADER + self.entries.len() * 24 + 8);
        b.extend_from_slice(MANIFEST_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.store_id);
        b.extend_from_slice(&self.pack_len.to_le_bytes());
        b.extend_from_slice(&self.next_id.to_le_bytes());
        for &(id, len, sum) in &self.entries {
            b.extend_from_slice(&id.to_le_bytes());
            b.extend_from_slice(&len.to_le_bytes());
            b.extend_from_slice(&sum.to_le_bytes());
        }
        let sum = checksum(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    }

    pub(super) fn decode(path: &Path, b: &[u8]) -> Result<Self> {
        if b.len() < MANIFEST_HEADER + 8 {
            return Err(corrupt(path, "the manifest is truncated"));
        }
        let body = &b[..b.len() - 8];
        if checksum(body) != u64_at(b, b.len() - 8) {
            return Err(corrupt(path, "manifest checksum mismatch"));
        }
        if &b[..8] != MANIFEST_MAGIC || u32_at(b, 8) != VERSION {
            return Err(corrupt(path, "not a version 2 manifest"));
        }
        let n = u32_at(b, 12) as usize;
        if n > MAX_SNAPSHOTS || body.len() != MANIFEST_HEADER + n * 24 {
            return Err(corrupt(
                path,
                "the manifest's length does not match its count",
            ));
        }
        let entries: Vec<(u64, u64, u64)> = body[MANIFEST_HEADER..]
            .chunks_exact(24)
            .map(|c| (u64_at(c, 0), u64_at(c, 8), u64_at(c, 16)))
            .collect();
        let next_id = u64_at(b, 40);
        if entries.windows(2).any(|w| w[0].0 >= w[1].0)
            || entries.iter().any(|e| e.0 == 0 || e.0 >= next_id)
        {
            return Err(corrupt(path, "the manifest's ids are out of order"));
        }
        Ok(Manifest {
            store_id: b[16..32].try_into().expect("16 bytes"),
            pack_len: u64_at(b, 32),
            next_id,
            entries,
        })
    }

    pub(super) fn entry(&self, id: u64) -> Option<(u64, u64)> {
        self.entries
            .binary_search_by_key(&id, |e| e.0)
            .ok()
            .map(|i| (self.entries[i].1, self.entries[i].2))
    }
}

pub(super) fn corrupt(path: &Path, what: impl Into<String>) -> Error {
    pagewise_mech::Error::Corrupt {
        path: path.display().to_string(),
        what: what.into(),
    }
    .into()
}

pub(super) fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::os(format!("{what} {}", path.display()), e)
}

pub(super) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

pub(super) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// A record's checksum: the payload's xxh3-64 seeded with its header's.
pub(super) fn record_checksum(header: &[u8], payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(payload, checksum(&header[..32]))
}

pub(super) fn parse_index(
    path: &Path,
    b: &[u8],
    pack_len: u64,
    store: &StoreId,
) -> Result<DiskSnapshot> {
    if b.len() < SNAP_HEADER + 8 {
        return Err(corrupt(path, "the index is truncated"));
    }
    let body = &b[..b.len() - 8];
    if checksum(body) != u64_at(b, b.len() - 8) {
        return Err(corrupt(path, "index checksum mismatch"));
    }
    if &b[..8] != SNAP_MAGIC {
        return Err(corrupt(path, "not a snapshot index"));
    }
    let version = u32_at(b, 8);
    if !(2..=INDEX_VERSION).contains(&version) {
        return Err(corrupt(path, format!("unknown index version {version}")));
    }
    if &b[48..64] != store {
        return Err(corrupt(
            path,
            "the index belongs to another store (its identity is not the manifest's)",
        ));
    }
    let nregions = u32_at(b, 12) as usize;
    let id = u64_at(b, 16);
    let created_ms = u64_at(b, 24);
    let pid = u64_at(b, 32) as i64;
    let label_len = u32_at(b, 40) as usize;
    let mut off = SNAP_HEADER;
    if label_len > MAX_LABEL || off + label_len > body.len() {
        return Err(corrupt(path, "bad label length"));
    }
    let label = String::from_utf8(body[off..off + label_len].to_vec())
        .map_err(|_| corrupt(path, "the label is not UTF-8"))?;
    off += label_len;
    // Version 3: the process record's length where version 2 has zero.
    let record_len = u32_at(b, 44) as usize;
    if record_len > MAX_RECORD || (version == 2 && record_len != 0) || record_len > body.len() - off
    {
        return Err(corrupt(path, "bad process record length"));
    }
    let record = body[off..off + record_len].to_vec();
    off += record_len;
    #[cfg(target_arch = "x86_64")]
    if !record.is_empty() {
        let r = ProcessRecord::decode(&record)
            .map_err(|why| corrupt(path, format!("bad process record: {why}")))?;
        // Sections came with version 4.
        if version < 4 && (r.fds.is_some() || r.identity.is_some()) {
            return Err(corrupt(
                path,
                "a process record with sections in index version 3",
            ));
        }
    }
    if nregions.saturating_mul(16) > body.len() - off {
        return Err(corrupt(path, "region table runs past the end"));
    }
    let mut regions = Vec::with_capacity(nregions);
    let mut pages = 0u64;
    for _ in 0..nregions {
        let r = Region::new(u64_at(body, off), u64_at(body, off + 8))
            .map_err(|e| corrupt(path, format!("bad region: {e}")))?;
        pages = pages.saturating_add(r.pages());
        regions.push(r);
        off += 16;
    }
    if pages > MAX_PAGES {
        return Err(corrupt(path, format!("the regions hold {pages} pages")));
    }
    let (entries, stored) = if version >= 5 {
        entries_from_runs(path, &body[off..], pages)?
    } else if (body.len() - off) as u64 != pages * 8 {
        return Err(corrupt(
            path,
            format!(
                "the index lists {} page entries where its regions hold {pages} pages",
                (body.len() - off) / 8
            ),
        ));
    } else {
        let entries: Vec<u64> = body[off..].chunks_exact(8).map(|c| u64_at(c, 0)).collect();
        let stored = (0..entries.len()).filter(|&i| entries[i] != 0).collect();
        (entries, stored)
    };
    if let Some(bad) = stored
        .iter()
        .map(|&i| entries[i])
        .find(|&e| e < PACK_HEADER || e + REC_HEADER as u64 > pack_len)
    {
        return Err(corrupt(
            path,
            format!("page entry {bad} points outside the pack ({pack_len} bytes)"),
        ));
    }
    Ok(DiskSnapshot {
        id,
        created_ms,
        pid: (pid != 0).then_some(pid as i32),
        label,
        regions,
        entries,
        stored,
        index_bytes: b.len() as u64,
        record,
    })
}

/// The entries of an index of version 5 (`words`: a record's offset per
/// stored page, [`ZERO_RUN`]` | n` per run of n zero pages), a `u64` per
/// page (0 for a zero page) of `pages`. The zero runs are never written:
/// the vector comes zeroed from the allocator (for a large one, fresh
/// pages of the kernel's), so a sparse snapshot's holes cost no memory.
/// Also the indexes of the pages stored, ascending.
fn entries_from_runs(path: &Path, words: &[u8], pages: u64) -> Result<(Vec<u64>, Vec<usize>)> {
    if !words.len().is_multiple_of(8) {
        return Err(corrupt(path, "the page entries are not whole words"));
    }
    // A few words may claim 2^32 pages: the list is had or refused, not
    // an abort of the reader.
    let mut entries = zeroed(pages as usize).ok_or_else(|| {
        corrupt(
            path,
            format!("the index lists {pages} pages, more than this machine can hold the list of"),
        )
    })?;
    let mut stored = Vec::new();
    let mut i = 0u64;
    for w in words.chunks_exact(8).map(|c| u64_at(c, 0)) {
        let n = if w & ZERO_RUN != 0 { w & !ZERO_RUN } else { 1 };
        if n == 0 || n > pages - i {
            return Err(corrupt(
                path,
                format!("the page entries run past the regions' {pages} pages"),
            ));
        }
        if w & ZERO_RUN == 0 && w != 0 {
            entries[i as usize] = w;
            stored.push(i as usize);
        }
        i += n;
    }
    if i != pages {
        return Err(corrupt(
            path,
            format!("the index lists {i} page entries where its regions hold {pages} pages"),
        ));
    }
    Ok((entries, stored))
}

/// `n` zero words, from the allocator's zeroed memory (for a large list,
/// fresh pages of the kernel's, which cost nothing until written), or
/// `None` where it has not that much.
fn zeroed(n: usize) -> Option<Vec<u64>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u64>(n).ok()?;
    // SAFETY: the layout's size is not zero (n > 0). A pointer that is not
    // null is a fresh allocation of the global allocator with this layout,
    // which is the one a `Vec<u64>` of capacity n frees with; its n words
    // are zeroed, and zero is a valid u64, so length n is initialised.
    unsafe {
        let p = std::alloc::alloc_zeroed(layout).cast::<u64>();
        (!p.is_null()).then(|| Vec::from_raw_parts(p, n, n))
    }
}
