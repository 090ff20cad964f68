//! A CRIU dump's images as `snapshot restore --criu` reads them: the
//! task's `pagemap-1.img`, `mm-1.img`, `pstree.img` and its one thread's
//! `core-1.img` (protobuf messages after CRIU's magics), written into a
//! directory of their own and read by `snap::criu::restore_in_place` for
//! a process that cannot exist (pid 0): the images are read whole before
//! any process is looked at, so an input is valid when the refusal is
//! that of the process.
//!
//! An input is three images each after its length (`u32`, little-endian):
//! the pagemap, the mm and the pstree image, then the core image.

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
        let mut rest = input;
        let mut parts = Vec::new();
        for _ in 0..3 {
            let Some((len, after)) = rest.split_first_chunk::<4>() else {
                return false;
            };
            let len = (u32::from_le_bytes(*len) as usize).min(after.len());
            let (part, after) = after.split_at(len);
            parts.push(part);
            rest = after;
        }
        parts.push(rest);
        let dir = self.dir.lock().unwrap_or_else(|e| e.into_inner());
        for (name, part) in ["pagemap-1.img", "mm-1.img", "pstree.img", "core-1.img"]
            .iter()
            .zip(&parts)
        {
            std::fs::write(dir.join(name), part).expect("a scratch file");
        }
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

/// Varint fields.
fn varints(fields: &[(u64, u64)]) -> Vec<u8> {
    let mut m = Vec::new();
    for &(field, v) in fields {
        varint(&mut m, field << 3);
        varint(&mut m, v);
    }
    m
}

/// A nested message as field `field`.
fn nested(out: &mut Vec<u8>, field: u64, m: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, m.len() as u64);
    out.extend_from_slice(m);
}

/// One message of varint fields after its size.
fn message(out: &mut Vec<u8>, fields: &[(u64, u64)]) {
    let m = varints(fields);
    out.extend_from_slice(&(m.len() as u32).to_ne_bytes());
    out.extend_from_slice(&m);
}

/// `PSTREE_MAGIC`, `CORE_MAGIC` (criu/include/magic.h).
const PSTREE_MAGIC: u32 = 0x5027_3030;
const CORE_MAGIC: u32 = 0x5505_3847;

/// A pstree image of task 1 with its one thread, and that thread's core
/// image: x86-64, every general register, the fxsave registers (with
/// AVX's upper halves where `ymm`), a signal mask and an alternate stack.
fn threads(rng: &mut Rng, ymm: bool) -> (Vec<u8>, Vec<u8>) {
    let mut pstree = IMG_COMMON_MAGIC.to_ne_bytes().to_vec();
    pstree.extend_from_slice(&PSTREE_MAGIC.to_ne_bytes());
    message(&mut pstree, &[(1, 1), (2, 0), (3, 1), (4, 1), (5, 1)]);
    let gp: Vec<(u64, u64)> = (1..=27).map(|f| (f, rng.below(1 << 20) as u64)).collect();
    let mut fp = varints(&[
        (1, 0x37f),
        (2, 0),
        (3, 0),
        (4, 0),
        (5, 0),
        (6, 0),
        (7, 0x1f80),
        (8, 0xffff),
    ]);
    for _ in 0..32 {
        fp.extend_from_slice(&varints(&[(9, rng.below(1 << 16) as u64)]));
    }
    for _ in 0..64 {
        fp.extend_from_slice(&varints(&[(10, rng.below(1 << 16) as u64)]));
    }
    if ymm {
        let mut xs = varints(&[(1, 7)]);
        for _ in 0..64 {
            xs.extend_from_slice(&varints(&[(2, rng.below(1 << 16) as u64)]));
        }
        nested(&mut fp, 13, &xs);
    }
    let mut info = varints(&[(1, 0)]);
    nested(&mut info, 2, &varints(&gp));
    nested(&mut info, 3, &fp);
    let mut tc = varints(&[(1, 0), (2, 0), (6, rng.below(1 << 16) as u64)]);
    nested(&mut tc, 7, &varints(&[(1, 0), (2, 0), (3, 2)]));
    let mut entry = varints(&[(1, 1)]);
    nested(&mut entry, 2, &info);
    nested(&mut entry, 5, &tc);
    let mut core = IMG_COMMON_MAGIC.to_ne_bytes().to_vec();
    core.extend_from_slice(&CORE_MAGIC.to_ne_bytes());
    core.extend_from_slice(&(entry.len() as u32).to_ne_bytes());
    core.extend_from_slice(&entry);
    (pstree, core)
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
    let ymm = rng.below(2) == 0;
    let (pstree, core) = threads(rng, ymm);
    let mut out = Vec::new();
    for part in [&pm, &img, &pstree] {
        out.extend_from_slice(&(part.len() as u32).to_le_bytes());
        out.extend_from_slice(part);
    }
    out.extend_from_slice(&core);
    out
}
