//! A snapshot store's files on disk (manifest, index, pages, process
//! records): a whole store written from the input, then every snapshot
//! loaded and every page read.
//!
//! An input is the store's files one after another, each as its name, a
//! zero byte, its length (4 bytes, little-endian) and its bytes; an input
//! that breaks this framing is refused before the store is opened.

use anyhow::Result;
use pagewise_mech::{Region, PAGE_SIZE};
use pagewise_snap::DiskStore;
use std::path::{Path, PathBuf};

use super::Target;
use crate::mutate::Rng;

/// A valid store's files and the directory cases are made in.
pub(super) struct Store {
    files: Vec<(String, Vec<u8>)>,
    case: PathBuf,
}

/// The files an input frames, or `None` when it breaks the framing (a
/// name not of `[A-Za-z0-9.-]`, over 64 bytes or repeated; a length past
/// the input's end; more than 16 files).
fn unframe(mut input: &[u8]) -> Option<Vec<(String, &[u8])>> {
    let mut files: Vec<(String, &[u8])> = Vec::new();
    while !input.is_empty() {
        let end = input.iter().take(65).position(|&b| b == 0)?;
        let name = std::str::from_utf8(&input[..end]).ok()?;
        let good = |c: char| c.is_ascii_alphanumeric() || c == '.' || c == '-';
        if name.is_empty() || name.starts_with('.') || !name.chars().all(good) {
            return None;
        }
        let rest = &input[end + 1..];
        let len = u32::from_le_bytes(rest.get(..4)?.try_into().ok()?) as usize;
        let bytes = rest.get(4..4usize.checked_add(len)?)?;
        if files.len() == 16 || files.iter().any(|(n, _)| n == name) {
            return None;
        }
        files.push((name.to_string(), bytes));
        input = &rest[4 + len..];
    }
    Some(files)
}

/// `files` framed as one input.
fn frame(files: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, bytes) in files {
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    }
    out
}

impl Store {
    /// Writes a store of two snapshots of three pages.
    pub(super) fn new(work: &Path) -> Result<Store> {
        let seed_dir = work.join("store-seed");
        let _ = std::fs::remove_dir_all(&seed_dir);
        {
            let mut s = DiskStore::create(&seed_dir, true)?;
            let r1 = Region::new(0x10000, 3 * PAGE_SIZE as u64)?;
            let mut buf = vec![0u8; 3 * PAGE_SIZE];
            buf[5] = 1;
            buf[PAGE_SIZE + 9] = 2;
            s.save(&[(r1, buf.clone())], Some(1), "one", None)?;
            buf[2 * PAGE_SIZE] = 3;
            s.save(&[(r1, buf)], Some(1), "two", None)?;
        }
        let mut files = Vec::new();
        for e in std::fs::read_dir(&seed_dir)?.flatten() {
            let p = e.path();
            if e.file_name() != "LOCK" {
                let bytes = std::fs::read(&p)?;
                let name = e.file_name().to_string_lossy().into_owned();
                files.push((name, bytes));
            }
        }
        files.sort();
        Ok(Store {
            files,
            case: work.join("store-case"),
        })
    }
}

impl Target for Store {
    fn feed(&self, input: &[u8]) -> bool {
        let Some(files) = unframe(input) else {
            return false;
        };
        if files.is_empty() {
            return false;
        }
        let _ = std::fs::remove_dir_all(&self.case);
        std::fs::create_dir_all(&self.case).expect("a scratch directory");
        std::fs::set_permissions(
            &self.case,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("a scratch directory of our own");
        for (name, bytes) in files {
            std::fs::write(self.case.join(name), bytes).expect("a scratch file");
        }
        let Ok(s) = DiskStore::open(&self.case) else {
            return false;
        };
        let Ok(ids) = s.ids() else {
            return false;
        };
        let mut read = !ids.is_empty();
        for id in ids {
            let Ok(snap) = s.load(id) else {
                read = false;
                continue;
            };
            let mut page = vec![0u8; PAGE_SIZE];
            for &off in &snap.entries {
                read &= s.read_page(off, &mut page).is_ok();
            }
        }
        read
    }

    fn seeds(&self, _rng: &mut Rng) -> Vec<Vec<u8>> {
        vec![frame(&self.files)]
    }
}
