//! Files pagewise writes where others may look or plant things (metrics
//! for a collector, reports, a workload's ground truth): each is replaced
//! whole, through a temporary file that is created new (`O_EXCL`), never
//! through a symbolic link (`O_NOFOLLOW`), in the target's own directory,
//! then renamed over the target (which replaces a link planted there
//! instead of following it). The one place such files are written.

use crate::{Error, Result};
use std::io::Write;
use std::path::Path;

/// Replaces `path` with `bytes`, readable by all (mode 0644 less the
/// umask), as the module says. The temporary file is removed on failure.
pub fn replace(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| Error::NoFileName {
            path: path.to_path_buf(),
        })?
        .to_string_lossy();
    let mut nonce = [0u8; 8];
    pagewise_sys::process::getrandom(&mut nonce)
        .map_err(|e| Error::os("getrandom for a temporary file name", e))?;
    let tmp = dir.join(format!(
        ".{name}.{}.{:016x}.tmp",
        std::process::id(),
        u64::from_ne_bytes(nonce)
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    written.map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        Error::os(format!("writing {}", path.display()), e)
    })
}

/// Opens (creating, owner-only) a file that a process holds locked for as
/// long as it keeps something (a store's writer lock, a setting's
/// journal): read and write, never through a link, never waiting on a
/// FIFO. The caller checks whose it is on the open file.
pub fn open_lock_file(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link planted where the file goes, or where the old temporary file
    /// went (`m.tmp` for `m.prom`), is replaced or left alone: the file it
    /// points to is never written.
    #[test]
    fn planted_links_are_not_followed() {
        let dir = std::env::temp_dir().join(format!("pagewise-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.join("m.prom");
        std::os::unix::fs::symlink(&victim, dir.join("m.tmp")).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        replace(&path, b"metrics 1\n").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(std::fs::read(&path).unwrap(), b"metrics 1\n");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        replace(&path, b"metrics 2\n").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"metrics 2\n");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name().to_string_lossy().ends_with(".tmp") && e.file_name() != "m.tmp"
            })
            .collect();
        assert!(left.is_empty(), "{left:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
