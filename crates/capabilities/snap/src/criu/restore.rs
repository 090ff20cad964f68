//! A later CRIU dump put into a running process in place: the process
//! (for instance one `criu restore` started from an earlier dump of it)
//! is stopped, each page the dump's images hold is compared with what the
//! process holds and written where it differs, every other page CRIU
//! would have left as zeros or as the file's is made so, and each thread
//! is put back as the dump caught it: what `criu restore` of the later
//! dump would have made of the process's memory and threads, writing
//! only the pages that differ.
//!
//! The images read are the task's `pagemap-ID.img` and the `pages-N.img`
//! it names, its `mm-ID.img` for the mappings the dump saw (`vma_entry`:
//! start, end, protection, CRIU's status), `pstree.img` for its threads
//! and each thread's `core-TID.img` (see `core`). CRIU leaves out of a
//! dump every page that was never touched or maps the zero page, and, in
//! a private mapping of a file, every page not copied on write: such a
//! page reads as zeros (anonymous memory) or as the file (a file's
//! mapping) after `criu restore`, and is made so here where the process
//! holds other bytes.
//!
//! What is put back and what is not:
//! - **memory**: every private mapping's pages as above, written through
//!   `/proc/PID/mem` (so also those of mappings the program made
//!   read-only since, as CRIU's restore writes them before it protects);
//! - **threads**: each thread's general registers (with the `fs`/`gs`
//!   bases), its `XSAVE` state, its signal mask and its alternate signal
//!   stack, as a rollback of pagewise's own snapshots puts them back. The
//!   dump's threads must be the process's, by their ids in its own pid
//!   namespace (as `criu restore` makes them);
//! - **the layout** is checked, not made: every private mapping of the
//!   dump must be mapped in the process with the same bounds and
//!   protection, and no private writable mapping may have appeared since
//!   ([`RollbackRefusal::CriuLayout`] names the first difference);
//! - **not put back**: descriptors, signal dispositions, timers, limits,
//!   credentials and everything else of the task's `core` but its
//!   threads' state; what a process changed of them since its base dump
//!   stays.
//!
//! Nothing is changed until every page has been compared and every image
//! read. Dumps whose pages sit in a parent dump (`PE_PARENT`, `criu dump
//! --prev-images-dir`) are refused: only whole dumps are read.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use pagewise_mech::inject::Remote;
use pagewise_mech::stop::Stopped;
use pagewise_mech::walk::PageWalker;
use pagewise_mech::{procfs, Region, PAGE_SIZE};
use serde::Serialize;

use super::core;
use super::images::{IMG_COMMON_MAGIC, PAGEMAP_MAGIC};
use super::wire::{PE_PARENT, PE_PRESENT};
use super::Run;
use crate::error::RollbackRefusal;
use crate::threads;
use crate::{Error, Result};

/// `MM_MAGIC` (criu/include/magic.h).
const MM_MAGIC: u32 = 0x5749_2820;

/// CRIU's `VMA_AREA_REGULAR`: a mapping CRIU dumps and restores.
const VMA_AREA_REGULAR: u32 = 1 << 0;
/// `VMA_AREA_VSYSCALL`, `VMA_AREA_VDSO`, `VMA_AREA_VVAR`: the kernel's.
const VMA_KERNELS: u32 = (1 << 2) | (1 << 3) | (1 << 12);
/// `VMA_FILE_PRIVATE`.
const VMA_FILE_PRIVATE: u32 = 1 << 6;
/// `VMA_ANON_PRIVATE`.
const VMA_ANON_PRIVATE: u32 = 1 << 9;
/// `PROT_WRITE`.
const PROT_WRITE: u32 = 2;

/// Room for the largest `XSAVE` area (with AMX tiles, about 11 KiB).
const XSTATE_MAX: usize = 16 << 10;

/// Threads comparing pages.
const COMPARERS: usize = 2;

/// Pages compared per read.
const CHUNK_PAGES: u64 = 256;

/// One mapping of a dump (`vma_entry`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Vma {
    start: u64,
    end: u64,
    /// The offset in the file mapped, in bytes.
    pgoff: u64,
    prot: u32,
    status: u32,
}

impl Vma {
    /// A private mapping whose pages CRIU dumps.
    fn private(&self) -> bool {
        self.status & VMA_AREA_REGULAR != 0
            && self.status & VMA_KERNELS == 0
            && self.status & (VMA_ANON_PRIVATE | VMA_FILE_PRIVATE) != 0
    }
}

/// One task's images in a CRIU dump directory.
#[derive(Debug)]
struct Images {
    task: u32,
    runs: Vec<Run>,
    vmas: Vec<Vma>,
    pages: PathBuf,
}

/// What an in-place restore of a CRIU dump did.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct InPlace {
    /// The process written into.
    pub pid: i32,
    /// The dump's task id (its images are `pagemap-ID.img`, `mm-ID.img`).
    pub task: u32,
    /// Pages of the dump's images compared with the process's.
    pub pages_compared: u64,
    /// Of those, pages that differed and were written.
    pub pages_written: u64,
    /// Pages the dump left out that the process held other bytes in, made
    /// zeros (anonymous memory) or the file's bytes again.
    pub pages_reset: u64,
    /// Threads whose registers, extended state, signal mask and
    /// alternate signal stack were put back.
    pub threads: u64,
    /// Time from the stop to the release, in nanoseconds.
    pub elapsed_ns: u64,
}

pub(super) fn corrupt(path: &Path, what: impl Into<String>) -> Error {
    pagewise_mech::Error::Corrupt {
        path: path.display().to_string(),
        what: what.into(),
    }
    .into()
}

pub(super) fn io(what: String, e: std::io::Error) -> Error {
    pagewise_mech::Error::os(what, e).into()
}

/// A protobuf field's value: a varint or fixed number, or bytes.
pub(super) enum Value<'a> {
    Int(u64),
    Bytes(&'a [u8]),
}

pub(super) fn varint(b: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*at)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// The fields of one protobuf message, in order; `None` where it is cut
/// short or uses a wire type protobuf 2 does not have.
pub(super) fn fields(b: &[u8]) -> Option<Vec<(u64, Value<'_>)>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < b.len() {
        let key = varint(b, &mut at)?;
        let value = match key & 7 {
            0 => Value::Int(varint(b, &mut at)?),
            1 => {
                let v = b.get(at..at + 8)?;
                at += 8;
                Value::Int(u64::from_le_bytes(v.try_into().ok()?))
            }
            2 => {
                let n = usize::try_from(varint(b, &mut at)?).ok()?;
                let v = b.get(at..at.checked_add(n)?)?;
                at += n;
                Value::Bytes(v)
            }
            5 => {
                let v = b.get(at..at + 4)?;
                at += 4;
                Value::Int(u64::from(u32::from_le_bytes(v.try_into().ok()?)))
            }
            _ => return None,
        };
        out.push((key >> 3, value));
    }
    Some(out)
}

/// The messages of an image file with image magic `magic`, each after its
/// `u32` size.
pub(super) fn messages<'a>(path: &Path, b: &'a [u8], magic: u32) -> Result<Vec<&'a [u8]>> {
    let word = |at: usize| {
        b.get(at..at + 4)
            .map(|w| u32::from_ne_bytes(w.try_into().expect("four bytes")))
    };
    if word(0) != Some(IMG_COMMON_MAGIC) || word(4) != Some(magic) {
        return Err(corrupt(
            path,
            format!("not a CRIU image with magic {magic:#x}"),
        ));
    }
    let mut out = Vec::new();
    let mut at = 8;
    while at < b.len() {
        let n = word(at).ok_or_else(|| corrupt(path, "a message size cut short"))? as usize;
        let m = b
            .get(at + 4..at + 4 + n)
            .ok_or_else(|| corrupt(path, format!("a message of {n} bytes cut short")))?;
        out.push(m);
        at += 4 + n;
    }
    Ok(out)
}

pub(super) fn int(f: &[(u64, Value<'_>)], field: u64) -> Option<u64> {
    f.iter().find_map(|(k, v)| match v {
        Value::Int(i) if *k == field => Some(*i),
        _ => None,
    })
}

pub(super) fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| io(format!("reading {}", path.display()), e))
}

/// The task of `dir` to read: `task`, or the only one there.
fn pick_task(dir: &Path, task: u32) -> Result<u32> {
    if dir.join(format!("pagemap-{task}.img")).exists() {
        return Ok(task);
    }
    let entries =
        std::fs::read_dir(dir).map_err(|e| io(format!("listing {}", dir.display()), e))?;
    let mut ids: Vec<u32> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_prefix("pagemap-")?
                .strip_suffix(".img")?
                .parse()
                .ok()
        })
        .collect();
    ids.sort_unstable();
    match ids.as_slice() {
        [only] => Ok(*only),
        _ => Err(RollbackRefusal::CriuImages {
            dir: dir.display().to_string(),
            why: format!(
                "no pagemap-{task}.img, and the dump's tasks are {ids:?}: name one with --task"
            ),
        }
        .into()),
    }
}

fn read_images(dir: &Path, task: u32) -> Result<Images> {
    let task = pick_task(dir, task)?;
    let path = dir.join(format!("pagemap-{task}.img"));
    let b = read(&path)?;
    let msgs = messages(&path, &b, PAGEMAP_MAGIC)?;
    let (head, entries) = msgs
        .split_first()
        .ok_or_else(|| corrupt(&path, "no pagemap_head"))?;
    let pages_id = fields(head)
        .and_then(|f| int(&f, 1))
        .ok_or_else(|| corrupt(&path, "a pagemap_head without pages_id"))?;
    let mut runs = Vec::with_capacity(entries.len());
    for m in entries {
        let f = fields(m).ok_or_else(|| corrupt(&path, "a pagemap_entry cut short"))?;
        let vaddr = int(&f, 1).ok_or_else(|| corrupt(&path, "a pagemap_entry without vaddr"))?;
        let nr_pages = int(&f, 5).or_else(|| int(&f, 2)).unwrap_or(0);
        // As CRIU reads an entry without flags: in its parent, or present.
        let flags = match (int(&f, 4), int(&f, 3)) {
            (Some(fl), _) => fl as u32,
            (None, Some(1)) => PE_PARENT,
            (None, _) => PE_PRESENT,
        };
        if vaddr % PAGE_SIZE as u64 != 0
            || nr_pages > super::USER_END / PAGE_SIZE as u64
            || vaddr.saturating_add(nr_pages * PAGE_SIZE as u64) > super::USER_END
        {
            return Err(corrupt(
                &path,
                format!("a run of {nr_pages} pages at {vaddr:#x} outside the user address space"),
            ));
        }
        runs.push(Run {
            vaddr,
            nr_pages,
            flags,
        });
    }
    let path = dir.join(format!("mm-{task}.img"));
    let b = read(&path)?;
    let msgs = messages(&path, &b, MM_MAGIC)?;
    let mm = msgs
        .first()
        .and_then(|m| fields(m))
        .ok_or_else(|| corrupt(&path, "no mm_entry"))?;
    let mut vmas = Vec::new();
    for (k, v) in &mm {
        if let (14, Value::Bytes(m)) = (k, v) {
            let f = fields(m).ok_or_else(|| corrupt(&path, "a vma_entry cut short"))?;
            let get = |n| int(&f, n).ok_or_else(|| corrupt(&path, "a vma_entry missing a field"));
            vmas.push(Vma {
                start: get(1)?,
                end: get(2)?,
                pgoff: get(3)?,
                prot: get(5)? as u32,
                status: get(7)? as u32,
            });
        }
    }
    Ok(Images {
        task,
        runs,
        vmas,
        pages: dir.join(format!("pages-{pages_id}.img")),
    })
}

/// The first way the process's mappings differ from the dump's, if any.
fn layout_difference(vmas: &[Vma], maps: &[procfs::Mapping]) -> Option<String> {
    let prot = |m: &procfs::Mapping| {
        u32::from(m.read) | (u32::from(m.write) << 1) | (u32::from(m.exec) << 2)
    };
    for v in vmas.iter().filter(|v| v.private()) {
        let Some(m) = maps.iter().find(|m| m.start < v.end && v.start < m.end) else {
            return Some(format!(
                "the dump's mapping {:#x}..{:#x} is not mapped",
                v.start, v.end
            ));
        };
        if (m.start, m.end, prot(m)) != (v.start, v.end, v.prot) || m.shared {
            return Some(format!(
                "the dump's mapping {:#x}..{:#x} (protection {}) is {:#x}..{:#x} (protection {}{}) now",
                v.start,
                v.end,
                v.prot,
                m.start,
                m.end,
                prot(m),
                if m.shared { ", shared" } else { "" }
            ));
        }
    }
    for m in maps.iter().filter(|m| m.write && !m.shared) {
        if !vmas.iter().any(|v| v.start == m.start && v.end == m.end) {
            return Some(format!(
                "{:#x}..{:#x} ({}) was mapped since the dump",
                m.start,
                m.end,
                if m.path.is_empty() {
                    "anonymous"
                } else {
                    &m.path
                }
            ));
        }
    }
    None
}

/// Puts the CRIU dump in `dir` (task `task`, by default the process's own
/// pid) into process `pid` in place: its memory and its threads'
/// registers, extended state, signal masks and alternate signal stacks
/// (see the module). The process is stopped meanwhile; it runs on from
/// where the dump caught it.
pub fn restore_in_place(dir: &Path, pid: i32, task: Option<u32>) -> Result<InPlace> {
    // The images are read whole before the process is looked at.
    let img = read_images(dir, task.unwrap_or(pid as u32))?;
    let refuse = |why: String| -> Error {
        RollbackRefusal::CriuImages {
            dir: dir.display().to_string(),
            why,
        }
        .into()
    };
    if let Some(r) = img.runs.iter().find(|r| r.flags & PE_PARENT != 0) {
        return Err(refuse(format!(
            "the pages at {:#x} are in a parent dump (criu dump --prev-images-dir): only whole dumps are read",
            r.vaddr
        )));
    }
    let dumped = core::threads_of(dir, img.task)?;
    // Every thread's image read and checked before the process is
    // stopped; the task's signal mask is in its leader's.
    let mut task_mask = None;
    for &t in &dumped {
        let (_, m) = core::thread_state(dir, t, vec![0; XSTATE_MAX], None)?;
        task_mask = task_mask.or(m);
    }
    // The first page of the dump in a private writable mapping: the
    // threads' alternate stacks are set through it, and it is written
    // whole afterwards.
    let scratch = img
        .runs
        .iter()
        .filter(|r| r.flags & PE_PRESENT != 0 && r.nr_pages > 0)
        .map(|r| r.vaddr)
        .find(|&a| {
            img.vmas
                .iter()
                .any(|v| v.private() && v.prot & PROT_WRITE != 0 && v.start <= a && a < v.end)
        })
        .ok_or_else(|| refuse("no page of the dump is in a private writable mapping".into()))?;
    procfs::check_target(pid)?;
    let pages =
        File::open(&img.pages).map_err(|e| io(format!("opening {}", img.pages.display()), e))?;
    let stopped = Stopped::new(pid)?;
    let t0 = Instant::now();
    // Checked once every thread is stopped: the process is the one named.
    procfs::check_target(pid)?;
    let maps = procfs::maps(Some(pid))?;
    if let Some(first) = layout_difference(&img.vmas, &maps) {
        return Err(RollbackRefusal::CriuLayout {
            pid,
            dir: dir.display().to_string(),
            first,
        }
        .into());
    }
    // The threads, by their ids in the process's own pid namespace (those
    // the dump knows them by).
    let mut now: Vec<(u32, i32)> = stopped
        .tids()
        .iter()
        .map(|&t| (pagewise_mech::container::ns_pid(t).unwrap_or(t) as u32, t))
        .collect();
    now.sort_unstable();
    let ids: Vec<u32> = now.iter().map(|&(n, _)| n).collect();
    if ids != dumped {
        return Err(RollbackRefusal::CriuLayout {
            pid,
            dir: dir.display().to_string(),
            first: format!("the dump's threads are {dumped:?}, the process's {ids:?}"),
        }
        .into());
    }
    let mut states = Vec::with_capacity(now.len());
    let mut buf = vec![0u8; XSTATE_MAX];
    for &(ns, tid) in &now {
        let n = pagewise_sys::process::ptrace_getregset(
            tid,
            pagewise_sys::process::NT_X86_XSTATE,
            &mut buf,
        )
        .map_err(|e| Error::for_pid(pid, format!("PTRACE_GETREGSET(NT_X86_XSTATE) of {tid}"), e))?;
        let (mut state, _) = core::thread_state(dir, ns, buf[..n].to_vec(), task_mask)?;
        state.tid = tid;
        states.push(state);
    }
    let mem = Mem::open(pid)?;
    let mut out = InPlace {
        pid,
        task: img.task,
        threads: states.len() as u64,
        ..InPlace::default()
    };
    // Every page compared and what differs noted before anything is
    // changed.
    let dump = Dumped::compare(&img, &pages, &mem)?;
    let resets = left_out_changes(&mem, &img.vmas, &dump.runs)?;
    // The threads first (their alternate stacks are set by calls made
    // inside them, which need the registers they have), then the memory.
    let remote = Remote::new(&stopped)?;
    threads::put_back(&stopped, &remote, &states, scratch)?;
    out.pages_compared = dump.compared;
    out.pages_written = dump.write(&pages, &mem)?;
    let mut page = vec![0u8; PAGE_SIZE];
    dump.page(&pages, scratch, &mut page)?;
    mem.write(scratch, &page)?;
    let zeros = vec![0u8; PAGE_SIZE];
    for (at, file) in &resets {
        mem.write(*at, file.as_deref().unwrap_or(&zeros))?;
    }
    out.pages_reset = resets.len() as u64;
    out.elapsed_ns = t0.elapsed().as_nanos() as u64;
    drop(remote);
    drop(stopped);
    Ok(out)
}

/// The dump's pages against the process's: where each present run's
/// pages are in the pages image, and which pages differ.
struct Dumped {
    /// Present runs: `[start, end)` and the pages image's offset of the
    /// first page, ascending.
    runs: Vec<(u64, u64, u64)>,
    /// Pages that differ: address and pages image offset, ascending.
    changes: Vec<(u64, u64)>,
    /// Pages compared.
    compared: u64,
}

impl Dumped {
    /// Compares every present page of `img` with the process's, in
    /// chunks of [`CHUNK_PAGES`] shared among [`COMPARERS`] threads (the
    /// comparison is bound by memory bandwidth, which one core does not
    /// fill).
    fn compare(img: &Images, pages: &File, mem: &Mem) -> Result<Self> {
        let mut runs = Vec::new();
        // (address, offset in the pages image, pages).
        let mut chunks = Vec::new();
        let mut offset = 0u64;
        for r in img.runs.iter().filter(|r| r.flags & PE_PRESENT != 0) {
            let end = r.vaddr + r.nr_pages * PAGE_SIZE as u64;
            runs.push((r.vaddr, end, offset));
            let mut at = r.vaddr;
            while at < end {
                let n = ((end - at) / PAGE_SIZE as u64).min(CHUNK_PAGES) as usize;
                chunks.push((at, offset, n));
                offset += (n * PAGE_SIZE) as u64;
                at += (n * PAGE_SIZE) as u64;
            }
        }
        runs.sort_unstable();
        use std::sync::atomic::{AtomicUsize, Ordering};
        let next = AtomicUsize::new(0);
        let one = || -> Result<Vec<(u64, u64)>> {
            let mut want = vec![0u8; (CHUNK_PAGES as usize) * PAGE_SIZE];
            let mut have = vec![0u8; want.len()];
            let mut changes = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(at, offset, n)) = chunks.get(i) else {
                    return Ok(changes);
                };
                let len = n * PAGE_SIZE;
                pages
                    .read_exact_at(&mut want[..len], offset)
                    .map_err(|e| io(format!("reading {} at {offset}", img.pages.display()), e))?;
                mem.read(at, &mut have[..len])?;
                for k in 0..n {
                    let p = k * PAGE_SIZE..(k + 1) * PAGE_SIZE;
                    if want[p.clone()] != have[p] {
                        let k = (k * PAGE_SIZE) as u64;
                        changes.push((at + k, offset + k));
                    }
                }
            }
        };
        let mut changes = std::thread::scope(|s| {
            let others: Vec<_> = (1..COMPARERS).map(|_| s.spawn(one)).collect();
            let mut all = one()?;
            for h in others {
                all.extend(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?);
            }
            Ok::<_, Error>(all)
        })?;
        changes.sort_unstable();
        Ok(Dumped {
            runs,
            changes,
            compared: offset / PAGE_SIZE as u64,
        })
    }

    /// The dump's bytes of page `at` (zeros where it holds none).
    fn page(&self, pages: &File, at: u64, out: &mut [u8]) -> Result<()> {
        match self
            .runs
            .get(self.runs.partition_point(|&(_, e, _)| e <= at))
        {
            Some(&(s, _, off)) if s <= at => pages
                .read_exact_at(out, off + (at - s))
                .map_err(|e| io(format!("reading the pages image at {}", off + (at - s)), e)),
            _ => {
                out.fill(0);
                Ok(())
            }
        }
    }

    /// Writes the pages that differ, a run of adjacent ones per write;
    /// returns how many.
    fn write(&self, pages: &File, mem: &Mem) -> Result<u64> {
        let mut buf = vec![0u8; (CHUNK_PAGES as usize) * PAGE_SIZE];
        let mut i = 0;
        while i < self.changes.len() {
            let (at, off) = self.changes[i];
            let mut n = 1;
            while i + n < self.changes.len()
                && n < CHUNK_PAGES as usize
                && self.changes[i + n]
                    == (at + (n * PAGE_SIZE) as u64, off + (n * PAGE_SIZE) as u64)
            {
                n += 1;
            }
            let b = &mut buf[..n * PAGE_SIZE];
            pages
                .read_exact_at(b, off)
                .map_err(|e| io(format!("reading the pages image at {off}"), e))?;
            mem.write(at, b)?;
            i += n;
        }
        Ok(self.changes.len() as u64)
    }
}

/// A stopped process's memory, through `process_vm_readv` and
/// `process_vm_writev` (one copy), or `/proc/PID/mem` where they cannot
/// reach (a page the program cannot read or write itself).
struct Mem {
    pid: i32,
    file: File,
}

impl Mem {
    fn open(pid: i32) -> Result<Mem> {
        let path = format!("/proc/{pid}/mem");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::for_pid(pid, format!("opening {path}"), e))?;
        Ok(Mem { pid, file })
    }

    fn read(&self, at: u64, b: &mut [u8]) -> Result<()> {
        if pagewise_mech::remote::read_exact(self.pid, at, b).is_ok() {
            return Ok(());
        }
        self.file
            .read_exact_at(b, at)
            .map_err(|e| Error::for_pid(self.pid, format!("reading {:#x}+{:#x}", at, b.len()), e))
    }

    fn write(&self, at: u64, b: &[u8]) -> Result<()> {
        // A mapping the program made read-only since takes the write
        // through /proc/PID/mem alone.
        if pagewise_mech::remote::write_exact(self.pid, at, b).is_ok() {
            return Ok(());
        }
        self.file
            .write_all_at(b, at)
            .map_err(|e| Error::for_pid(self.pid, format!("writing {:#x}+{:#x}", at, b.len()), e))
    }
}

/// The pages the dump left out (outside its present `runs`) of its
/// private writable mappings that the process holds other bytes in than
/// `criu restore` would make: zeros in anonymous memory (`None`), the
/// file's bytes in a file's mapping (`Some` of them; where the process
/// copied them on write since).
fn left_out_changes(
    mem: &Mem,
    vmas: &[Vma],
    runs: &[(u64, u64, u64)],
) -> Result<Vec<(u64, Option<Vec<u8>>)>> {
    use pagewise_sys::pagemap::category::{FILE, PRESENT, SWAPPED};
    let mut walker = PageWalker::new(Some(mem.pid))?;
    let (mut found, mut out) = (Vec::new(), Vec::new());
    let (mut have, mut want) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
    for v in vmas.iter() {
        if !v.private() || v.prot & PROT_WRITE == 0 {
            continue;
        }
        let anon = v.status & VMA_ANON_PRIVATE != 0;
        let region = Region::new(v.start, v.end - v.start)?;
        walker.categories(
            region,
            PRESENT | SWAPPED,
            PRESENT | SWAPPED | FILE,
            &mut found,
        )?;
        // A file's page not copied on write is the file's already.
        for pr in found.iter().filter(|pr| anon || pr.categories & FILE == 0) {
            for at in (pr.start..pr.end).step_by(PAGE_SIZE) {
                let inside = runs
                    .get(runs.partition_point(|&(_, e, _)| e <= at))
                    .is_some_and(|&(s, _, _)| s <= at);
                if inside {
                    continue;
                }
                mem.read(at, &mut have)?;
                if anon {
                    want.fill(0);
                } else {
                    file_page(mem.pid, v, at, &mut want)?;
                }
                if have != want {
                    out.push((at, (!anon).then(|| want.clone())));
                }
            }
        }
    }
    Ok(out)
}

/// The bytes of the file mapped privately by `v` at page `at`, as the
/// process maps it (`/proc/PID/map_files`): what CRIU's restore maps
/// there; zeros past the file's end.
fn file_page(pid: i32, v: &Vma, at: u64, out: &mut [u8]) -> Result<()> {
    let path = format!("/proc/{pid}/map_files/{:x}-{:x}", v.start, v.end);
    let f = File::open(&path).map_err(|e| Error::for_pid(pid, format!("opening {path}"), e))?;
    out.fill(0);
    let mut got = 0;
    while got < out.len() {
        match f.read_at(&mut out[got..], v.pgoff + at - v.start + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::for_pid(pid, format!("reading {path}"), e)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(magic: u32, msgs: &[&[u8]]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(&IMG_COMMON_MAGIC.to_ne_bytes());
        b.extend_from_slice(&magic.to_ne_bytes());
        for m in msgs {
            b.extend_from_slice(&(m.len() as u32).to_ne_bytes());
            b.extend_from_slice(m);
        }
        b
    }

    #[test]
    fn messages_are_split_and_checked() {
        let p = Path::new("x.img");
        let b = image(MM_MAGIC, &[&[8, 1], &[]]);
        assert_eq!(
            messages(p, &b, MM_MAGIC).unwrap(),
            vec![&[8u8, 1][..], &[][..]]
        );
        // Another image's magic, a size past the end, a cut size.
        assert!(messages(p, &b, PAGEMAP_MAGIC).is_err());
        // A size cut short, a message cut short.
        assert!(messages(p, &b[..b.len() - 2], MM_MAGIC).is_err());
        assert!(messages(p, &b[..13], MM_MAGIC).is_err());
        let mut long = image(MM_MAGIC, &[&[8, 1]]);
        long[8] = 200;
        assert!(messages(p, &long, MM_MAGIC).is_err());
    }

    #[test]
    fn fields_read_each_wire_type_and_refuse_what_is_cut() {
        // 1: varint 300; 2: bytes "ab"; 3: fixed32 7; 4: fixed64 9.
        let m = [
            8, 0xac, 2, 18, 2, b'a', b'b', 29, 7, 0, 0, 0, 33, 9, 0, 0, 0, 0, 0, 0, 0,
        ];
        let f = fields(&m).unwrap();
        assert_eq!(int(&f, 1), Some(300));
        assert!(matches!(f[1], (2, Value::Bytes(b"ab"))));
        assert_eq!(int(&f, 3), Some(7));
        assert_eq!(int(&f, 4), Some(9));
        for n in 1..m.len() {
            if [3, 7, 12].contains(&n) {
                continue; // whole fields
            }
            assert!(fields(&m[..n]).is_none(), "cut at {n}");
        }
        // A length past the end, a varint of eleven bytes, wire type 3.
        assert!(fields(&[18, 200, 1]).is_none());
        assert!(
            fields(&[8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 1]).is_none()
        );
        assert!(fields(&[11]).is_none());
    }

    #[test]
    fn a_layout_differs_where_a_private_mapping_moved_or_appeared() {
        let vma = |start, end, prot| Vma {
            start,
            end,
            pgoff: 0,
            prot,
            status: VMA_AREA_REGULAR | VMA_ANON_PRIVATE,
        };
        let map = |start: u64, end: u64, write: bool| {
            let line = format!(
                "{start:x}-{end:x} r{}-p 00000000 00:00 0",
                if write { "w" } else { "-" }
            );
            procfs::parse_maps(&line).remove(0)
        };
        let dump = [vma(0x1000, 0x3000, 3)];
        assert_eq!(layout_difference(&dump, &[map(0x1000, 0x3000, true)]), None);
        let grown = layout_difference(&dump, &[map(0x1000, 0x4000, true)]).unwrap();
        assert!(grown.contains("0x1000..0x4000"), "{grown}");
        let read_only = layout_difference(&dump, &[map(0x1000, 0x3000, false)]).unwrap();
        assert!(read_only.contains("protection 1"), "{read_only}");
        let gone = layout_difference(&dump, &[]).unwrap();
        assert!(gone.contains("is not mapped"), "{gone}");
        let new = layout_difference(
            &dump,
            &[map(0x1000, 0x3000, true), map(0x8000, 0x9000, true)],
        )
        .unwrap();
        assert!(new.contains("mapped since the dump"), "{new}");
    }
}
