//! Instance names and the directory they live in: names made up that no
//! one can guess, names checked, a shared directory another user could
//! rewrite refused.

use super::{dir, euid};
use crate::{Error, Result};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// A name no one can guess in advance: `PREFIX-` and 16 random hex digits.
pub(crate) fn unpredictable_name(prefix: &str) -> String {
    let mut r = [0u8; 8];
    if pagewise_sys::process::getrandom(&mut r).ok() != Some(r.len()) {
        // Never fails for 8 bytes once the pool is ready; fall back to time.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        r = t.to_le_bytes();
    }
    format!("{prefix}-{:016x}", u64::from_le_bytes(r))
}

/// Whether an instance named `name` exists (its file is in [`dir`]).
pub fn exists(name: &str) -> bool {
    dir().join(name).exists()
}

/// Refuses a shared directory that another user could rewrite under us.
pub(super) fn check_dir(d: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let md = std::fs::symlink_metadata(d)
        .map_err(|e| Error::os(format!("reading {}", d.display()), e))?;
    let mode = md.permissions().mode();
    let others_write = mode & 0o022 != 0;
    if !md.is_dir() || (md.uid() != euid() && md.uid() != 0) || (others_write && mode & 0o1000 == 0)
    {
        return Err(Error::UnsafeDirectory {
            dir: d.to_path_buf(),
            uid: md.uid(),
            mode: mode & 0o7777,
        });
    }
    Ok(())
}

pub(super) fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        || name.starts_with('.')
    {
        return Err(Error::BadInstanceName {
            name: name.to_string(),
        });
    }
    Ok(())
}
