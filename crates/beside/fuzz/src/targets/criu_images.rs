//! A CRIU dump's images as `snapshot restore --criu` reads them: the
//! task's `pagemap-1.img` and `mm-1.img` (protobuf messages after CRIU's
//! magics), written into a directory of their own and read by
//! `snap::criu::restore_in_place` for a process that cannot exist (pid
//! 0): the images are read whole before any process is looked at, so an
//! input is valid when the refusal is that of the process.
//!
//! An input is the pagemap image's length (`u32`, little-endian), the
//! pagemap image, then the mm image.

use anyhow::Result;
use pagewise_snap::criu::{IMG_COMMON_MAGIC, PAGEMAP_MAGIC};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::Target;
use crate::mutate::Rng;

/// `MM_MAGIC` (criu/include/magic.h).
const MM_MAGIC: u32 = 0x5749_2820;

/// The directory the images are written to (one input at a time).
pub(super) struct CriuImages {
    dir: Mutex<PathBuf>,
}

impl CriuImages {
    pub(super) fn new(work: &Path) -> Result<CriuImages> {
        let dir = work.join("criu-images");
        std::fs::create_dir_all(&dir)?;
        Ok(CriuImages {
            dir: Mutex::new(dir),
        })
    }
}

impl Target for CriuImages {
    fn feed(&self, input: &[u8]) -> bool {
        let Some((len, rest)) = input.split_first_chunk::<4>() else {
            return false;
        };
        let len = (u32::from_le_bytes(*len) as usize).min(rest.len());
        let (pagemap, mm) = rest.split_at(len);
        let dir = self.dir.lock().unwrap_or_else(|e| e.into_inner());
        std::fs::write(dir.join("pagemap-1.img"), pagemap).expect("a scratch file");
        std::fs::write(dir.join("mm-1.img"), mm).expect("a scratch file");
        match pagewise_snap::criu::restore_in_place(&dir, 0, Some(1)) {
            Ok(_) => panic!("an in-place restore into pid 0"),
            // Read whole; then the process is refused.
            Err(e) => e.to_string().contains("no process with pid 0"),
        }
    }

    fn seeds(&self, rng: &mut Rng) -> Vec<Vec<u8>> {
        (0..6).map(|_| images(rng)).collect()
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// One message of varint fields after its size.
fn message(out: &mut Vec<u8>, fields: &[(u64, u64)]) {
    let mut m = Vec::new();
    for &(field, v) in fields {
        varint(&mut m, field << 3);
        varint(&mut m, v);
    }
    out.extend_from_slice(&(m.len() as u32).to_ne_bytes());
    out.extend_from_slice(&m);
}

/// A valid pair of images: a pagemap of a few runs (present, lazy), and
/// an mm entry with a few mappings (each a nested `vma_entry`).
fn images(rng: &mut Rng) -> Vec<u8> {
    let mut pm = Vec::new();
    pm.extend_from_slice(&IMG_COMMON_MAGIC.to_ne_bytes());
    pm.extend_from_slice(&PAGEMAP_MAGIC.to_ne_bytes());
    message(&mut pm, &[(1, 0x10001)]);
    let mut vaddr = 0x5555_0000_0000u64;
    for _ in 0..1 + rng.below(4) {
        let nr = 1 + rng.below(8) as u64;
        let flags = if rng.below(2) == 0 { 4 } else { 6 };
        message(&mut pm, &[(1, vaddr), (2, 0), (4, flags), (5, nr)]);
        vaddr += (nr + rng.below(4) as u64) * 4096;
    }
    let mut mm = Vec::new();
    mm.extend_from_slice(&MM_MAGIC.to_ne_bytes());
    let mut entry = Vec::new();
    for f in 1..=11u64 {
        varint(&mut entry, f << 3);
        varint(&mut entry, 0x5555_0000_0000 + f * 4096);
    }
    let mut start = 0x5555_0000_0000u64;
    for _ in 0..1 + rng.below(3) {
        let end = start + (1 + rng.below(16) as u64) * 4096;
        let mut vma = Vec::new();
        // start, end, pgoff, shmid, prot, flags, status; fd (sint64 -1: 1).
        for (f, v) in [
            (1, start),
            (2, end),
            (3, 0),
            (4, 0),
            (5, 3),
            (6, 0x22),
            (7, 0x201),
            (8, 1),
        ] {
            varint(&mut vma, f << 3);
            varint(&mut vma, v);
        }
        varint(&mut entry, 14 << 3 | 2);
        varint(&mut entry, vma.len() as u64);
        entry.extend_from_slice(&vma);
        start = end + 4096;
    }
    let mut img = IMG_COMMON_MAGIC.to_ne_bytes().to_vec();
    img.extend_from_slice(&mm);
    img.extend_from_slice(&(entry.len() as u32).to_ne_bytes());
    img.extend_from_slice(&entry);
    let mut out = (pm.len() as u32).to_le_bytes().to_vec();
    out.extend_from_slice(&pm);
    out.extend_from_slice(&img);
    out
}
