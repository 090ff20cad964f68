//! Creating and opening a store: the lock that lets one writer in, the
//! checks of its files, and recovery after an interrupted save.

use super::*;

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
    pub(super) fn create_whole(dir: &Path) -> Result<()> {
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

    pub(super) fn open_inner(dir: PathBuf, writable: bool) -> Result<Self> {
        check_dir(&dir)?;
        let marker = dir.join(STORE_FILE);
        let text = match fs::symlink_metadata(&marker) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(StoreError::NotAStore {
                    dir: dir.clone(),
                    file: STORE_FILE,
                }
                .into())
            }
            _ => read_regular(&marker)?,
        };
        let old_format = STORE_TEXT_OLD.iter().any(|t| text == t.as_bytes());
        if text != STORE_TEXT.as_bytes() && !old_format {
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
        if writable && old_format {
            // Its next index may be of version 5: a reader of an older
            // format must not take it for a store it reads.
            let tmp = dir.join("STORE.tmp");
            write_synced(&tmp, STORE_TEXT.as_bytes())?;
            fs::rename(&tmp, &marker).map_err(|e| io(&marker, "renaming into", e))?;
        }
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
            saving_from: None,
            writable,
            verify: true,
        };
        s.check_files()?;
        Ok(s)
    }

    /// Takes the store's writer lock, or says who holds it.
    pub(super) fn lock(dir: &Path) -> Result<File> {
        use std::os::fd::AsFd;
        let path = dir.join(LOCK_FILE);
        let f = pagewise_mech::files::open_lock_file(&path).map_err(|e| io(&path, "opening", e))?;
        check_owned(&path, &f.metadata().map_err(|e| io(&path, "reading", e))?)?;
        if let Err(e) = pagewise_sys::process::flock_exclusive_nonblocking(f.as_fd()) {
            return Err(if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
                StoreError::Locked {
                    store: dir.to_path_buf(),
                }
                .into()
            } else {
                io(&path, "locking", e)
            });
        }
        Ok(f)
    }

    /// Every index the manifest names is there, and no other index is
    /// (but the one an interrupted save may have left: the next id's).
    pub(super) fn check_files(&self) -> Result<()> {
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
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// For writing: reads every committed record's header to learn which
    /// pages are stored (any damage there is an error: appending must never
    /// overwrite what a saved index refers to), drops what a save that did
    /// not commit left past the committed length, and removes temporary
    /// files and the uncommitted index.
    pub(super) fn recover(&mut self) -> Result<()> {
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
}
