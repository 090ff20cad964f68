//! A stored snapshot's pages written out for other tools: raw bytes (every
//! region one after the other, or one address range), or an ELF core file
//! that `gdb PROGRAM CORE` and `readelf` read: one `PT_LOAD` segment per
//! region, with the protection the snapshot recorded, an `NT_PRSTATUS`
//! note per thread with its registers and an `NT_FILE` note naming the
//! files mapped (store format 3).

use super::disk::{DiskSnapshot, DiskStore};
use crate::{Error, Result};
use pagewise_mech::PAGE_SIZE;
use std::io::Write;

/// Where one region's bytes went in the file written.
#[derive(Debug, Clone, Copy, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Placed {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Offset of its first byte in the file.
    pub file_offset: u64,
}

/// The pages of `snap` in `[lo, hi)` of its regions, in order, to `out`
/// (`range = None`: every region); where each went. A range must lie
/// wholly inside the snapshot's regions.
pub fn raw(
    disk: &DiskStore,
    snap: &DiskSnapshot,
    range: Option<(u64, u64)>,
    out: &mut impl Write,
) -> Result<Vec<Placed>> {
    let page = PAGE_SIZE as u64;
    if let Some((a, b)) = range {
        if a >= b || a % page != 0 || b % page != 0 {
            return Err(Error::BadRange { start: a, end: b });
        }
    }
    let mut placed = Vec::new();
    let mut buf = vec![0u8; PAGE_SIZE];
    let (mut first, mut at) = (0usize, 0u64);
    for r in &snap.regions {
        let (lo, hi) = match range {
            Some((a, b)) => (a.max(r.start), b.min(r.end())),
            None => (r.start, r.end()),
        };
        if lo < hi {
            placed.push(Placed {
                start: lo,
                end: hi,
                file_offset: at,
            });
            let i = first + ((lo - r.start) / page) as usize;
            for &e in &snap.entries[i..i + ((hi - lo) / page) as usize] {
                disk.read_page(e, &mut buf)?;
                out.write_all(&buf)
                    .map_err(|e| Error::os("writing the pages", e))?;
            }
            at += hi - lo;
        }
        first += r.pages() as usize;
    }
    if let Some((a, b)) = range {
        if at != b - a {
            return Err(Error::RangeNotInSnapshot {
                start: a,
                end: b,
                id: snap.id,
                covered: at,
            });
        }
    }
    Ok(placed)
}

const PT_LOAD: u32 = 1;
const PT_NOTE: u32 = 4;
const NT_PRSTATUS: u32 = 1;
/// The files mapped and where (`NT_FILE`): lets a debugger place a
/// position-independent program and its libraries.
const NT_FILE: u32 = 0x4649_4c45;
/// `sizeof(struct elf_prstatus)` on x86-64.
const PRSTATUS: usize = 336;
/// Offset of `pr_reg` in it.
const PR_REG: usize = 112;

/// Appends one ELF note named `CORE`.
fn note(out: &mut Vec<u8>, kind: u32, desc: &[u8]) {
    out.extend_from_slice(&5u32.to_le_bytes());
    out.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(b"CORE\0\0\0\0");
    out.extend_from_slice(desc);
    out.resize(out.len().next_multiple_of(4), 0);
}

/// The notes: an `NT_PRSTATUS` per recorded thread.
#[cfg(target_arch = "x86_64")]
fn notes(snap: &DiskSnapshot) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    if snap.record.is_empty() {
        return Ok(out);
    }
    let rec = super::disk::ProcessRecord::decode(&snap.record)
        .map_err(|why| Error::BadRecord { id: snap.id, why })?;
    for t in &rec.threads {
        let mut d = vec![0u8; PRSTATUS];
        d[24..32].copy_from_slice(&t.sigmask.to_le_bytes());
        d[32..36].copy_from_slice(&t.tid.to_le_bytes());
        let r = &t.regs;
        let words = [
            r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx,
            r.rdx, r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base,
            r.gs_base, r.ds, r.es, r.fs, r.gs,
        ];
        for (k, w) in words.iter().enumerate() {
            d[PR_REG + k * 8..PR_REG + k * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        note(&mut out, NT_PRSTATUS, &d);
    }
    let files: Vec<_> = rec
        .layout
        .iter()
        .filter_map(|v| match &v.backing {
            crate::layout::Backing::File { path, .. } => Some((v, path)),
            _ => None,
        })
        .collect();
    if !files.is_empty() {
        let mut d = Vec::new();
        d.extend_from_slice(&(files.len() as u64).to_le_bytes());
        d.extend_from_slice(&(PAGE_SIZE as u64).to_le_bytes());
        for (v, _) in &files {
            d.extend_from_slice(&v.start.to_le_bytes());
            d.extend_from_slice(&v.end.to_le_bytes());
            d.extend_from_slice(&(v.offset / PAGE_SIZE as u64).to_le_bytes());
        }
        for (_, path) in &files {
            d.extend_from_slice(path.as_bytes());
            d.push(0);
        }
        note(&mut out, NT_FILE, &d);
    }
    Ok(out)
}

#[cfg(not(target_arch = "x86_64"))]
fn notes(_snap: &DiskSnapshot) -> Result<Vec<u8>> {
    Ok(Vec::new())
}

/// The protection of `[start, end)` as the snapshot recorded it (`PF_*`
/// flags); read and write where it recorded none.
#[cfg(target_arch = "x86_64")]
fn flags_of(snap: &DiskSnapshot, start: u64) -> u32 {
    let rec = (!snap.record.is_empty())
        .then(|| super::disk::ProcessRecord::decode(&snap.record).ok())
        .flatten();
    let prot = rec
        .and_then(|r| {
            r.layout
                .iter()
                .find(|v| v.start <= start && start < v.end)
                .map(|v| v.prot)
        })
        .unwrap_or(libc::PROT_READ | libc::PROT_WRITE);
    // PF_X = 1, PF_W = 2, PF_R = 4.
    (if prot & libc::PROT_EXEC != 0 { 1 } else { 0 })
        | (if prot & libc::PROT_WRITE != 0 { 2 } else { 0 })
        | (if prot & libc::PROT_READ != 0 { 4 } else { 0 })
}

#[cfg(not(target_arch = "x86_64"))]
fn flags_of(_snap: &DiskSnapshot, _start: u64) -> u32 {
    6
}

/// `snap` as an ELF core file to `out`; its size.
pub fn core(disk: &DiskStore, snap: &DiskSnapshot, out: &mut impl Write) -> Result<u64> {
    let notes = notes(snap)?;
    let nph = 1 + snap.regions.len();
    let headers = 64 + 56 * nph;
    let notes_at = headers as u64;
    let mut at = (notes_at + notes.len() as u64).next_multiple_of(PAGE_SIZE as u64);
    let mut h = Vec::with_capacity(headers);
    // The ELF header: 64-bit, little-endian, version 1, System V, ET_CORE,
    // EM_X86_64.
    h.extend_from_slice(b"\x7fELF\x02\x01\x01\x00");
    h.extend_from_slice(&[0u8; 8]);
    h.extend_from_slice(&4u16.to_le_bytes());
    h.extend_from_slice(&62u16.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&0u64.to_le_bytes()); // entry
    h.extend_from_slice(&64u64.to_le_bytes()); // program headers
    h.extend_from_slice(&0u64.to_le_bytes()); // section headers
    h.extend_from_slice(&0u32.to_le_bytes()); // flags
    h.extend_from_slice(&64u16.to_le_bytes());
    h.extend_from_slice(&56u16.to_le_bytes());
    h.extend_from_slice(&(nph as u16).to_le_bytes());
    h.extend_from_slice(&[0u8; 6]); // no sections
    let ph =
        |h: &mut Vec<u8>, kind: u32, flags: u32, off: u64, vaddr: u64, size: u64, align: u64| {
            h.extend_from_slice(&kind.to_le_bytes());
            h.extend_from_slice(&flags.to_le_bytes());
            h.extend_from_slice(&off.to_le_bytes());
            h.extend_from_slice(&vaddr.to_le_bytes());
            h.extend_from_slice(&0u64.to_le_bytes());
            h.extend_from_slice(&size.to_le_bytes());
            h.extend_from_slice(&size.to_le_bytes());
            h.extend_from_slice(&align.to_le_bytes());
        };
    ph(&mut h, PT_NOTE, 0, notes_at, 0, notes.len() as u64, 4);
    for r in &snap.regions {
        ph(
            &mut h,
            PT_LOAD,
            flags_of(snap, r.start),
            at,
            r.start,
            r.len,
            PAGE_SIZE as u64,
        );
        at += r.len;
    }
    let w = |out: &mut dyn Write, b: &[u8]| {
        out.write_all(b)
            .map_err(|e| Error::os("writing the core", e))
    };
    w(out, &h)?;
    w(out, &notes)?;
    let pad = (notes_at + notes.len() as u64).next_multiple_of(PAGE_SIZE as u64)
        - notes_at
        - notes.len() as u64;
    w(out, &vec![0u8; pad as usize])?;
    raw(disk, snap, None, out)?;
    Ok(at)
}
