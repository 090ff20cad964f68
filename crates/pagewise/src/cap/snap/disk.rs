//! The durable snapshot store: snapshots saved to a directory, each distinct
//! page stored once across all of them, compressed, checksummed.
//!
//! # Format, version 2
//!
//! All integers are little-endian. A store is a directory (mode 0700; every
//! file 0600: it holds raw process memory) holding:
//!
//! * `STORE` — the text `pagewise-store 2\n`: marks the directory and names
//!   the format version. A reader refuses any other version.
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
//!   digits): a 64-byte header (`PWSNAP\0\0`; `u32` version = 2; `u32`
//!   region count; `u64` id; `u64` creation time, ms since the Unix epoch;
//!   `i64` source pid or 0; `u32` label length; `u32` 0; the 16-byte store
//!   identity), the label (UTF-8), the regions (`u64` start, `u64` length
//!   each), one `u64` per page of the regions in order — the offset of its
//!   record in `pages.pack`, or 0 for a zero page — and last a `u64` xxh3-64
//!   checksum of every byte before it.
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
//! [`Error::Corrupt`] naming the file, never wrong data. Every file carries
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

use crate::mech::hash::{checksum, page_digest, zero_page_digest, PageDigest, ZERO_PAGE};
use crate::mech::region::push_coalesced;
use crate::{Error, PageRange, Region, Result, PAGE_SIZE};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

const STORE_FILE: &str = "STORE";
const STORE_TEXT: &str = "pagewise-store 2\n";
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
/// Most snapshots a manifest may list when reading.
const MAX_SNAPSHOTS: usize = 1 << 24;
/// A store's identity, in every one of its files.
type StoreId = [u8; 16];
/// Largest label accepted.
const MAX_LABEL: usize = 4096;
/// Largest snapshot accepted when reading (2^32 pages: 16 TiB).
const MAX_PAGES: u64 = 1 << 32;

/// A snapshot as saved in a store.
#[derive(Debug, Clone, Serialize)]
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
    /// Size of the index file.
    pub index_bytes: u64,
}

impl DiskSnapshot {
    /// Index of the first page of region `r` in the entries, when the
    /// snapshot has exactly that region.
    pub fn first_page_of(&self, r: &Region) -> Option<usize> {
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
        self.entries.iter().filter(|&&e| e == 0).count() as u64
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
#[derive(Debug, Clone, Default, Serialize)]
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
#[derive(Debug, Clone, Copy, Default, Serialize)]
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

/// What the store holds (the `MANIFEST` file).
#[derive(Debug, Clone)]
struct Manifest {
    store_id: StoreId,
    /// Committed length of the pack.
    pack_len: u64,
    next_id: u64,
    /// `(id, index length, index checksum)`, ascending by id.
    entries: Vec<(u64, u64, u64)>,
}

impl Manifest {
    fn encode(&self) -> Vec<u8> {
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

    fn decode(path: &Path, b: &[u8]) -> Result<Self> {
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

    fn entry(&self, id: u64) -> Option<(u64, u64)> {
        self.entries
            .binary_search_by_key(&id, |e| e.0)
            .ok()
            .map(|i| (self.entries[i].1, self.entries[i].2))
    }
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
    writable: bool,
    verify: bool,
}

fn corrupt(path: &Path, what: impl Into<String>) -> Error {
    Error::Corrupt {
        path: path.display().to_string(),
        what: what.into(),
    }
}

fn io(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::os(format!("{what} {}", path.display()), e)
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().expect("8 bytes"))
}

/// A record's checksum: the payload's xxh3-64 seeded with its header's.
fn record_checksum(header: &[u8], payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(payload, checksum(&header[..32]))
}

/// Opens `path` for reading (and writing) only if it is a regular file: a
/// FIFO or a device in a store's place is an error, never a wait.
fn open_regular(path: &Path, write: bool) -> Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io(path, "opening", e))?;
    let md = f.metadata().map_err(|e| io(path, "reading", e))?;
    if !md.is_file() {
        return Err(corrupt(path, "not a regular file"));
    }
    check_owned(path, &md)?;
    Ok(f)
}

/// Refuses a store file or directory that is not the caller's own (its
/// effective user's), as the open file says (not the path, which another
/// user could swap): a store in another user's hands would hand them the
/// memory saved into it, or feed this user theirs. A directory others may
/// write is refused likewise.
fn check_owned(path: &Path, md: &fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = pagewise_sys::process::geteuid();
    if md.uid() != me {
        return Err(Error::NotPermitted(format!(
            "{} belongs to user {}, not to you (user {me}): a store must be its user's own, \
             or another user could read the memory saved in it",
            path.display(),
            md.uid()
        )));
    }
    if md.is_dir() && md.mode() & 0o022 != 0 {
        return Err(Error::NotPermitted(format!(
            "{} may be written by other users (mode {:o}): a store's directory must be its \
             user's alone",
            path.display(),
            md.mode() & 0o7777
        )));
    }
    Ok(())
}

/// Checks the store directory `dir` with [`check_owned`], on the opened
/// directory.
fn check_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let d = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY)
        .open(dir)
        .map_err(|e| io(dir, "opening", e))?;
    let md = d.metadata().map_err(|e| io(dir, "reading", e))?;
    check_owned(dir, &md)
}

/// The whole of a regular file (see [`open_regular`]).
fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut f = open_regular(path, false)?;
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut b).map_err(|e| io(path, "reading", e))?;
    Ok(b)
}

/// A new store identity: 16 random bytes.
fn new_store_id() -> Result<StoreId> {
    let mut id = [0u8; 16];
    std::io::Read::read_exact(
        &mut File::open("/dev/urandom").map_err(|e| io(Path::new("/dev/urandom"), "opening", e))?,
        &mut id,
    )
    .map_err(|e| io(Path::new("/dev/urandom"), "reading", e))?;
    Ok(id)
}

impl DiskStore {
    /// Opens the store in `dir` for reading and writing, creating it if `dir`
    /// does not exist or is empty (owner-only: it holds process memory).
    /// Only one process may have a store open for writing. Cleans up after
    /// an interrupted save; refuses a store whose committed data is damaged.
    pub fn create(dir: impl AsRef<Path>, verify: bool) -> Result<Self> {
        let dir = dir.as_ref().to_path_buf();
        let fresh = match fs::read_dir(&dir) {
            Ok(mut it) => it.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(io(&dir, "reading", e)),
        };
        if fresh {
            Self::create_whole(&dir)?;
        }
        let mut s = Self::open_inner(dir, true)?;
        s.verify = verify;
        s.recover()?;
        Ok(s)
    }

    /// Makes a new, empty store at `dir` (absent or an empty directory):
    /// built whole in a directory of its own beside it, then renamed into
    /// place, so that two creators at once leave one complete store (the
    /// second finds it made and opens it) and never a half-made one.
    fn create_whole(dir: &Path) -> Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        let parent = match dir.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&parent)
            .map_err(|e| io(&parent, "creating", e))?;
        let name = dir
            .file_name()
            .map_or_else(|| "store".into(), |n| n.to_string_lossy().into_owned());
        let mut nonce = [0u8; 8];
        pagewise_sys::process::getrandom(&mut nonce).map_err(|e| io(dir, "creating", e))?;
        let tmp = parent.join(format!(
            ".{name}.creating-{}-{:016x}",
            std::process::id(),
            u64::from_ne_bytes(nonce)
        ));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&tmp)
            .map_err(|e| io(&tmp, "creating", e))?;
        let made = (|| {
            let store_id = new_store_id()?;
            let mut header = Vec::with_capacity(PACK_HEADER as usize);
            header.extend_from_slice(PACK_MAGIC);
            header.extend_from_slice(&VERSION.to_le_bytes());
            header.extend_from_slice(&0u32.to_le_bytes());
            header.extend_from_slice(&store_id);
            write_synced(&tmp.join(PACK_FILE), &header)?;
            let m = Manifest {
                store_id,
                pack_len: PACK_HEADER,
                next_id: 1,
                entries: Vec::new(),
            };
            write_synced(&tmp.join(MANIFEST_FILE), &m.encode())?;
            // STORE last: a directory with it is a complete store.
            write_synced(&tmp.join(STORE_FILE), STORE_TEXT.as_bytes())?;
            sync_dir(&tmp)
        })();
        let placed = made.and_then(|()| match fs::rename(&tmp, dir) {
            Ok(()) => sync_dir(&parent),
            // Another creator placed its store first: it is complete.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY) | Some(libc::EEXIST)) => {
                Ok(())
            }
            Err(e) => Err(io(dir, "creating", e)),
        });
        let _ = fs::remove_dir_all(&tmp);
        placed
    }

    /// Opens the store in `dir` for reading only.
    pub fn open(dir: impl AsRef<Path>) -> Result<Self> {
        Self::open_inner(dir.as_ref().to_path_buf(), false)
    }

    fn open_inner(dir: PathBuf, writable: bool) -> Result<Self> {
        check_dir(&dir)?;
        let marker = dir.join(STORE_FILE);
        let text = match fs::symlink_metadata(&marker) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::NotFound(format!(
                    "{} is not a pagewise snapshot store (it has no {STORE_FILE} file)",
                    dir.display()
                )))
            }
            _ => read_regular(&marker)?,
        };
        if text != STORE_TEXT.as_bytes() {
            let text = String::from_utf8_lossy(&text);
            return Err(corrupt(
                &marker,
                format!(
                    "unknown store format {:?} (this pagewise reads {:?}{})",
                    text.trim(),
                    STORE_TEXT.trim(),
                    if text.trim() == "pagewise-store 1" {
                        "; format 1 was written by an older pagewise"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let lock = if writable {
            Some(Self::lock(&dir)?)
        } else {
            None
        };
        let pack_path = dir.join(PACK_FILE);
        let pack = open_regular(&pack_path, writable)?;
        let pack_file_len = pack
            .metadata()
            .map_err(|e| io(&pack_path, "reading", e))?
            .len();
        let mut header = [0u8; PACK_HEADER as usize];
        pack.read_exact_at(&mut header, 0)
            .map_err(|_| corrupt(&pack_path, "the pack header is truncated"))?;
        if &header[..8] != PACK_MAGIC || u32_at(&header, 8) != VERSION {
            return Err(corrupt(&pack_path, "bad pack header"));
        }
        let manifest_path = dir.join(MANIFEST_FILE);
        let manifest = Manifest::decode(&manifest_path, &read_regular(&manifest_path)?)?;
        if header[16..32] != manifest.store_id {
            return Err(corrupt(
                &pack_path,
                "the pack belongs to another store (its identity is not the manifest's)",
            ));
        }
        if manifest.pack_len < PACK_HEADER || pack_file_len < manifest.pack_len {
            return Err(corrupt(
                &pack_path,
                format!(
                    "the pack holds {pack_file_len} bytes where the manifest committed {}",
                    manifest.pack_len
                ),
            ));
        }
        let s = DiskStore {
            dir,
            pack,
            pack_len: manifest.pack_len,
            manifest,
            _lock: lock,
            index: HashMap::new(),
            writable,
            verify: true,
        };
        s.check_files()?;
        Ok(s)
    }

    /// Takes the store's writer lock, or says who holds it.
    fn lock(dir: &Path) -> Result<File> {
        use std::os::fd::AsFd;
        let path = dir.join(LOCK_FILE);
        let f = crate::mech::files::open_lock_file(&path).map_err(|e| io(&path, "opening", e))?;
        check_owned(&path, &f.metadata().map_err(|e| io(&path, "reading", e))?)?;
        if let Err(e) = pagewise_sys::process::flock_exclusive_nonblocking(f.as_fd()) {
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                Error::Busy(format!(
                    "store {} is being written by another process: one writer at a time",
                    dir.display()
                ))
            } else {
                io(&path, "locking", e)
            });
        }
        Ok(f)
    }

    /// Every index the manifest names is there, and no other index is
    /// (but the one an interrupted save may have left: the next id's).
    fn check_files(&self) -> Result<()> {
        let mut seen = 0usize;
        for e in fs::read_dir(&self.dir).map_err(|e| io(&self.dir, "reading", e))? {
            let e = e.map_err(|e| io(&self.dir, "reading", e))?;
            let name = e.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with("snap-") || name.ends_with(".tmp") {
                continue;
            }
            let id = name
                .strip_prefix("snap-")
                .and_then(|n| n.strip_suffix(".idx"))
                .filter(|n| n.len() >= 10 && n.bytes().all(|c| c.is_ascii_digit()))
                .and_then(|n| n.parse::<u64>().ok())
                .filter(|&id| self.index_path(id).file_name() == Some(e.file_name().as_os_str()));
            match id.map(|id| (id, self.manifest.entry(id))) {
                Some((_, Some((len, _)))) => {
                    let md = e.metadata().map_err(|err| io(&e.path(), "reading", err))?;
                    if !md.is_file() {
                        return Err(corrupt(&e.path(), "not a regular file"));
                    }
                    let size = md.len();
                    if size != len {
                        return Err(corrupt(
                            &e.path(),
                            format!("the index holds {size} bytes where the manifest lists {len}"),
                        ));
                    }
                    seen += 1;
                }
                Some((id, None)) if id == self.manifest.next_id => {}
                _ => return Err(corrupt(
                    &e.path(),
                    "an index file the store's manifest does not list (renamed, copied or stray)",
                )),
            }
        }
        if seen != self.manifest.entries.len() {
            let missing = self
                .manifest
                .entries
                .iter()
                .find(|(id, ..)| !self.index_path(*id).exists())
                .map_or(0, |e| e.0);
            return Err(corrupt(
                &self.index_path(missing),
                format!("snapshot {missing}'s index file is missing"),
            ));
        }
        Ok(())
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// For writing: reads every committed record's header to learn which
    /// pages are stored (any damage there is an error: appending must never
    /// overwrite what a saved index refers to), drops what a save that did
    /// not commit left past the committed length, and removes temporary
    /// files and the uncommitted index.
    fn recover(&mut self) -> Result<()> {
        let pack_path = self.dir.join(PACK_FILE);
        let committed = self.manifest.pack_len;
        let mut off = PACK_HEADER;
        let mut header = [0u8; REC_HEADER];
        let mut payload = vec![0u8; PAGE_SIZE];
        let refuse = |off: u64, what: &str| {
            corrupt(
                &pack_path,
                format!(
                    "{what} at offset {off}, inside the part saved snapshots use: \
                     refusing to append to a damaged store"
                ),
            )
        };
        while off < committed {
            if off + REC_HEADER as u64 > committed {
                return Err(refuse(off, "a truncated record"));
            }
            self.pack
                .read_exact_at(&mut header, off)
                .map_err(|e| io(&pack_path, "reading", e))?;
            let len = u32_at(&header, 8) as usize;
            if u32_at(&header, 0) != REC_MAGIC || len > PAGE_SIZE {
                return Err(refuse(off, "a bad record header"));
            }
            let end = off + (REC_HEADER + len) as u64;
            if end > committed {
                return Err(refuse(off, "a truncated record"));
            }
            self.pack
                .read_exact_at(&mut payload[..len], off + REC_HEADER as u64)
                .map_err(|e| io(&pack_path, "reading", e))?;
            if record_checksum(&header, &payload[..len]) != u64_at(&header, 32) {
                return Err(refuse(off, "a checksum mismatch"));
            }
            let digest = u128::from_le_bytes(header[16..32].try_into().expect("16 bytes"));
            self.index.entry(digest).or_default().push(off);
            off = end;
        }
        self.pack
            .set_len(committed)
            .map_err(|e| io(&pack_path, "truncating", e))?;
        self.pack_len = committed;
        let _ = fs::remove_file(self.index_path(self.manifest.next_id));
        for e in fs::read_dir(&self.dir).map_err(|e| io(&self.dir, "reading", e))? {
            let e = e.map_err(|e| io(&self.dir, "reading", e))?;
            if e.file_name().to_string_lossy().ends_with(".tmp") {
                let _ = fs::remove_file(e.path());
            }
        }
        Ok(())
    }

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
            return Err(Error::NotFound(format!(
                "store {} has no snapshot {id}",
                self.dir.display()
            )));
        };
        let path = self.index_path(id);
        let bytes = match read_regular(&path) {
            Err(Error::Os { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
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
        read(&mut buf[..REC_HEADER], offset)?;
        let len = u32_at(&buf, 8) as usize;
        if u32_at(&buf, 0) != REC_MAGIC
            || len > PAGE_SIZE
            || offset + (REC_HEADER + len) as u64 > self.pack_len
        {
            return Err(corrupt(&path, format!("bad record at offset {offset}")));
        }
        read(
            &mut buf[REC_HEADER..REC_HEADER + len],
            offset + REC_HEADER as u64,
        )?;
        let header = &buf[..REC_HEADER];
        let payload = &buf[REC_HEADER..REC_HEADER + len];
        if record_checksum(header, payload) != u64_at(header, 32) {
            return Err(corrupt(
                &path,
                format!("checksum mismatch in the record at offset {offset}"),
            ));
        }
        match header[4] {
            0 if len == PAGE_SIZE => out.copy_from_slice(payload),
            1 => match lz4_flex::block::decompress_into(payload, out) {
                Ok(PAGE_SIZE) => {}
                _ => {
                    return Err(corrupt(
                        &path,
                        format!("the record at offset {offset} does not decompress to a page"),
                    ))
                }
            },
            _ => {
                return Err(corrupt(
                    &path,
                    format!("unknown encoding in the record at offset {offset}"),
                ))
            }
        }
        let digest = u128::from_le_bytes(header[16..32].try_into().expect("16 bytes"));
        if page_digest(out) != digest {
            return Err(corrupt(
                &path,
                format!("the page at offset {offset} does not match its digest"),
            ));
        }
        Ok(())
    }

    /// Starts saving a snapshot of `regions`: push its pages in order, then finish.
    pub fn writer(
        &mut self,
        regions: &[Region],
        pid: Option<i32>,
        label: &str,
    ) -> Result<SnapshotWriter<'_>> {
        if !self.writable {
            return Err(Error::NotPermitted(format!(
                "store {} was opened read-only",
                self.dir.display()
            )));
        }
        if label.len() > MAX_LABEL {
            return Err(Error::Invalid(format!(
                "label longer than {MAX_LABEL} bytes"
            )));
        }
        let id = self.manifest.next_id;
        if id == u64::MAX {
            return Err(Error::Limit(format!(
                "store {} has used every snapshot id",
                self.dir.display()
            )));
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
            entries: Vec::with_capacity(pages as usize),
            pages,
            stats: SaveStats::default(),
            compressed: vec![0u8; lz4_flex::block::get_maximum_output_size(PAGE_SIZE)],
            check: vec![0u8; PAGE_SIZE],
            recent: RecordCache::new(),
            flushed,
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
        let order: Vec<Region> = regions.iter().map(|(r, _)| *r).collect();
        let mut w = self.writer(&order, pid, label)?;
        for (r, buf) in regions {
            let before = since.and_then(|(p, changed)| p.first_page_of(r).map(|i| (p, i, changed)));
            let Some((prev, first, changed)) = before else {
                for page in buf.chunks_exact(PAGE_SIZE) {
                    w.push(page)?;
                }
                continue;
            };
            // Walk the changed ranges that meet this region, in order.
            let mut k = changed.partition_point(|c| c.end() <= r.start);
            for (i, page) in buf.chunks_exact(PAGE_SIZE).enumerate() {
                let addr = r.start + (i * PAGE_SIZE) as u64;
                while k < changed.len() && changed[k].end() <= addr {
                    k += 1;
                }
                if k < changed.len() && changed[k].start <= addr {
                    w.push(page)?;
                } else {
                    w.push_unchanged(prev, first + i)?;
                }
            }
        }
        w.finish()
    }

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
            for &e in &s.entries {
                if e == 0 {
                    st.zero_pages += 1;
                } else {
                    st.referenced_pages += 1;
                    seen.insert(e);
                }
            }
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

/// Checks that `dest` has the shape (region count and sizes) of snapshot `s`.
pub(crate) fn check_same_shape(s: &DiskSnapshot, dest: &[Region]) -> Result<()> {
    let ok =
        s.regions.len() == dest.len() && s.regions.iter().zip(dest).all(|(a, b)| a.len == b.len);
    if ok {
        Ok(())
    } else {
        let sizes: Vec<u64> = s.regions.iter().map(|r| r.len).collect();
        let want: Vec<u64> = dest.iter().map(|r| r.len).collect();
        Err(Error::Invalid(format!(
            "snapshot {} has regions of sizes {sizes:?}, the destination {want:?}",
            s.id
        )))
    }
}

fn parse_index(path: &Path, b: &[u8], pack_len: u64, store: &StoreId) -> Result<DiskSnapshot> {
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
    if u32_at(b, 8) != VERSION {
        return Err(corrupt(
            path,
            format!("unknown index version {}", u32_at(b, 8)),
        ));
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
    if pages > MAX_PAGES || (body.len() - off) as u64 != pages * 8 {
        return Err(corrupt(
            path,
            format!(
                "the index lists {} page entries where its regions hold {pages} pages",
                (body.len() - off) / 8
            ),
        ));
    }
    let entries: Vec<u64> = body[off..].chunks_exact(8).map(|c| u64_at(c, 0)).collect();
    if let Some(bad) = entries
        .iter()
        .find(|&&e| e != 0 && (e < PACK_HEADER || e + REC_HEADER as u64 > pack_len))
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
        index_bytes: b.len() as u64,
    })
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
    entries: Vec<u64>,
    pages: u64,
    stats: SaveStats,
    compressed: Vec<u8>,
    check: Vec<u8>,
    /// Pack bytes below this offset have reached the file (not only the buffer).
    flushed: u64,
    recent: RecordCache,
}

/// Contents of records this writer appended or read back, so that verifying
/// a page against a record it just saw needs no read (a process repeats a
/// few contents many times). Per writer: a record's offset names the same
/// contents only while the writer that saw it lives (an unfinished save's
/// records are overwritten later).
struct RecordCache {
    offsets: Vec<u64>,
    pages: Vec<u8>,
}

impl RecordCache {
    const SLOTS: usize = 256;

    fn new() -> Self {
        RecordCache {
            // Offset 0 is never a record (the pack header is there): an empty slot.
            offsets: vec![0; Self::SLOTS],
            pages: vec![0; Self::SLOTS * PAGE_SIZE],
        }
    }

    fn slot(off: u64) -> usize {
        (off.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % Self::SLOTS
    }

    fn get(&self, off: u64) -> Option<&[u8]> {
        let i = Self::slot(off);
        (self.offsets[i] == off).then(|| &self.pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE])
    }

    fn put(&mut self, off: u64, page: &[u8]) {
        let i = Self::slot(off);
        self.offsets[i] = off;
        self.pages[i * PAGE_SIZE..(i + 1) * PAGE_SIZE].copy_from_slice(page);
    }
}

impl std::fmt::Debug for SnapshotWriter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotWriter")
            .field("id", &self.id)
            .field("pages", &self.entries.len())
            .finish()
    }
}

impl SnapshotWriter<'_> {
    /// Appends the next page (4096 bytes).
    pub fn push(&mut self, page: &[u8]) -> Result<()> {
        let digest = page_digest(page);
        self.push_digested(page, digest)
    }

    /// Appends the next page whose digest the caller computed.
    pub fn push_digested(&mut self, page: &[u8], digest: PageDigest) -> Result<()> {
        assert_eq!(page.len(), PAGE_SIZE);
        if self.entries.len() as u64 >= self.pages {
            return Err(Error::Invalid(
                "more pages pushed than the regions hold".into(),
            ));
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
    pub fn push_unchanged(&mut self, prev: &DiskSnapshot, i: usize) -> Result<()> {
        if self.entries.len() as u64 >= self.pages {
            return Err(Error::Invalid(
                "more pages pushed than the regions hold".into(),
            ));
        }
        if !self.store.manifest.entries.iter().any(|e| e.0 == prev.id) {
            return Err(Error::Invalid(format!(
                "snapshot {} is not in store {}",
                prev.id,
                self.store.dir.display()
            )));
        }
        let e = *prev
            .entries
            .get(i)
            .ok_or_else(|| Error::Invalid(format!("snapshot {} has no page {i}", prev.id)))?;
        if e == 0 {
            self.stats.zero_pages += 1;
        }
        self.entries.push(e);
        Ok(())
    }

    /// Appends a run of `n` zero pages.
    pub fn push_zeros(&mut self, n: u64) -> Result<()> {
        if self.entries.len() as u64 + n > self.pages {
            return Err(Error::Invalid(
                "more pages pushed than the regions hold".into(),
            ));
        }
        self.entries.extend(std::iter::repeat_n(0, n as usize));
        self.stats.zero_pages += n;
        Ok(())
    }

    fn same_as_record(&mut self, off: u64, page: &[u8]) -> Result<bool> {
        if let Some(seen) = self.recent.get(off) {
            return Ok(seen == page);
        }
        if off >= self.flushed {
            let path = self.store.dir.join(PACK_FILE);
            self.out.flush().map_err(|e| io(&path, "writing", e))?;
            self.flushed = self.store.pack_len;
        }
        let mut check = std::mem::take(&mut self.check);
        let r = self.store.read_page(off, &mut check);
        let same = r.is_ok() && check == page;
        if r.is_ok() {
            self.recent.put(off, &check);
        }
        self.check = check;
        r.map(|_| same)
    }

    fn append(&mut self, page: &[u8], digest: PageDigest) -> Result<u64> {
        let n = lz4_flex::block::compress_into(page, &mut self.compressed)
            .map_err(|e| Error::Internal(format!("lz4: {e}")))?;
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

    /// Makes the snapshot durable and visible; returns what was written.
    pub fn finish(mut self) -> Result<SaveStats> {
        if self.entries.len() as u64 != self.pages {
            return Err(Error::Invalid(format!(
                "{} pages pushed where the regions hold {}",
                self.entries.len(),
                self.pages
            )));
        }
        let pack_path = self.store.dir.join(PACK_FILE);
        self.out.flush().map_err(|e| io(&pack_path, "writing", e))?;
        self.out
            .get_ref()
            .sync_data()
            .map_err(|e| io(&pack_path, "syncing", e))?;
        let mut b = Vec::with_capacity(SNAP_HEADER + self.entries.len() * 8 + 64);
        b.extend_from_slice(SNAP_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(self.regions.len() as u32).to_le_bytes());
        b.extend_from_slice(&self.id.to_le_bytes());
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        b.extend_from_slice(&now.to_le_bytes());
        b.extend_from_slice(&(self.pid.unwrap_or(0) as i64).to_le_bytes());
        b.extend_from_slice(&(self.label.len() as u32).to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.extend_from_slice(&self.store.manifest.store_id);
        b.extend_from_slice(self.label.as_bytes());
        for r in &self.regions {
            b.extend_from_slice(&r.start.to_le_bytes());
            b.extend_from_slice(&r.len.to_le_bytes());
        }
        for e in &self.entries {
            b.extend_from_slice(&e.to_le_bytes());
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
        self.stats.id = self.id;
        self.stats.pages = self.pages;
        self.stats.index_bytes = b.len() as u64;
        Ok(self.stats)
    }
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| io(path, "creating", e))?;
    f.write_all(bytes).map_err(|e| io(path, "writing", e))?;
    f.sync_all().map_err(|e| io(path, "syncing", e))
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, "syncing", e))
}
