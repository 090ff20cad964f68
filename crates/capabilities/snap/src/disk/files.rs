//! The store's files on disk: opened without following links, owned by the
//! caller and no one else, written whole and synced.

use super::*;

/// Opens `path` for reading (and writing) only if it is a regular file: a
/// FIFO or a device in a store's place is an error, never a wait.
pub(super) fn open_regular(path: &Path, write: bool) -> Result<File> {
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
pub(super) fn check_owned(path: &Path, md: &fs::Metadata) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let me = pagewise_sys::process::geteuid();
    if md.uid() != me {
        return Err(StoreError::NotOwned {
            path: path.to_path_buf(),
            owner: md.uid(),
            you: me,
        }
        .into());
    }
    if md.is_dir() && md.mode() & 0o022 != 0 {
        return Err(StoreError::WritableByOthers {
            path: path.to_path_buf(),
            mode: md.mode() & 0o7777,
        }
        .into());
    }
    Ok(())
}

/// Checks the store directory `dir` with [`check_owned`], on the opened
/// directory.
pub(super) fn check_dir(dir: &Path) -> Result<()> {
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
pub(super) fn read_regular(path: &Path) -> Result<Vec<u8>> {
    let mut f = open_regular(path, false)?;
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut b).map_err(|e| io(path, "reading", e))?;
    Ok(b)
}

/// A new store identity: 16 random bytes.
pub(super) fn new_store_id() -> Result<StoreId> {
    let mut id = [0u8; 16];
    std::io::Read::read_exact(
        &mut File::open("/dev/urandom").map_err(|e| io(Path::new("/dev/urandom"), "opening", e))?,
        &mut id,
    )
    .map_err(|e| io(Path::new("/dev/urandom"), "reading", e))?;
    Ok(id)
}

pub(super) fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
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

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io(dir, "syncing", e))
}
