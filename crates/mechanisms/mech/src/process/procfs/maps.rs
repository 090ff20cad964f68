//! `/proc/PID/maps`: a process's mappings, parsed, sorted by kind, and
//! read again and again from a file kept open.

use super::proc_dir;
use crate::{Error, Result};

/// One line of `/proc/PID/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Mapping {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Executable.
    pub exec: bool,
    /// Shared (`s`) rather than private (`p`).
    pub shared: bool,
    /// File offset.
    pub offset: u64,
    /// Inode (0 for anonymous memory).
    pub inode: u64,
    /// Path or pseudo-name such as `[heap]`; empty for anonymous mappings.
    pub path: String,
}

/// The kinds of memory a capability may be asked to work on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MemoryKind {
    /// Private anonymous memory: `malloc`, anonymous `mmap`, the heap and stacks.
    PrivateAnonymous,
    /// Shared memory: `MAP_SHARED` anonymous, shmem, `memfd`, shared files.
    Shared,
    /// A private mapping of a file (copy-on-write).
    FilePrivate,
    /// hugetlbfs pages (`MAP_HUGETLB`, hugetlb `memfd`).
    Hugetlb,
}

impl MemoryKind {
    /// How it is said in errors.
    pub fn name(self) -> &'static str {
        match self {
            MemoryKind::PrivateAnonymous => "private anonymous",
            MemoryKind::Shared => "shared (shmem, memfd or MAP_SHARED)",
            MemoryKind::FilePrivate => "file-backed private",
            MemoryKind::Hugetlb => "hugetlb",
        }
    }
}

impl Mapping {
    /// The kind of memory this mapping holds. hugetlb is recognised by the
    /// names the kernel gives it (`/anon_hugepage`, a hugetlbfs file under
    /// a path with `hugepages` in it, a hugetlb memfd `/memfd:… (deleted)` is
    /// seen as shared).
    pub fn kind(&self) -> MemoryKind {
        if self.path.starts_with("/anon_hugepage") || self.path.contains("hugepages") {
            MemoryKind::Hugetlb
        } else if self.shared {
            MemoryKind::Shared
        } else if self.is_anonymous() {
            MemoryKind::PrivateAnonymous
        } else {
            MemoryKind::FilePrivate
        }
    }

    /// Private memory not backed by a file: anonymous mappings, `[heap]`, `[stack]`.
    pub fn is_anonymous(&self) -> bool {
        !self.shared
            && self.inode == 0
            && (self.path.is_empty()
                || self.path == "[heap]"
                || self.path.starts_with("[stack")
                || self.path.starts_with("[anon:"))
    }
    /// Whether it is pagewise's own memory inside the process (the preload
    /// shim's heap and threads' stacks, a far-memory engine's staging):
    /// named `[anon:pagewise-…]` where the kernel names mappings. The agents
    /// never take it for the program's.
    pub fn is_pagewise(&self) -> bool {
        self.path.starts_with(OWN_MAPPING_PREFIX)
    }
    /// Whether it is a far-memory engine's staging (which holds remote pages
    /// of the program's own regions; reading a hole in it could wait on its
    /// engine). Only where the kernel names anonymous mappings.
    pub fn is_staging(&self) -> bool {
        self.path
            .strip_prefix("[anon:")
            .and_then(|n| n.strip_suffix(']'))
            .is_some_and(|n| n.as_bytes() == STAGING_NAME.to_bytes())
    }
    /// Kernel-provided special mappings that must never be touched.
    pub fn is_special(&self) -> bool {
        matches!(
            self.path.as_str(),
            "[vvar]" | "[vdso]" | "[vsyscall]" | "[vvar_vclock]" | "[uprobes]"
        )
    }
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.end - self.start
    }
    /// Whether the mapping is empty (never, for a kernel-reported mapping).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Parses the text of a `maps` file.
pub fn parse_maps(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_maps_line).collect()
}

fn parse_maps_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.as_bytes();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let inode: u64 = it.next()?.parse().ok()?;
    let path = it.next().unwrap_or("").trim_start().to_string();
    let (s, e) = range.split_once('-')?;
    if perms.len() < 4 {
        return None;
    }
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        read: perms[0] == b'r',
        write: perms[1] == b'w',
        exec: perms[2] == b'x',
        shared: perms[3] == b's',
        offset,
        inode,
        path,
    })
}

/// Reads and parses `/proc/PID/maps` (or `/proc/self/maps`).
pub fn maps(pid: Option<i32>) -> Result<Vec<Mapping>> {
    let path = proc_dir(pid).join("maps");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::at(pid, format!("reading {}", path.display()), e))?;
    Ok(parse_maps(&text))
}

/// How `/proc/PID/maps` shows a mapping pagewise named as its own
/// ([`Mapping::is_pagewise`]): every such name starts with `pagewise-`.
pub const OWN_MAPPING_PREFIX: &str = "[anon:pagewise-";

/// The name a thread pagewise starts inside a program gives its stack
/// ([`Mapping::is_pagewise`]).
pub const OWN_THREAD_STACK: &std::ffi::CStr = c"pagewise-thread-stack";

/// The name of every far-memory staging mapping: `/proc/PID/maps` shows
/// `[anon:pagewise-farmem-staging]` where the kernel names mappings
/// ([`Mapping::is_staging`]).
pub const STAGING_NAME: &std::ffi::CStr = c"pagewise-farmem-staging";

/// Most ranges of pagewise's own memory noted in one process.
pub const MAX_OWN: u32 = 64;

/// pagewise's own memory in this process (the preload shim's heap, its
/// threads' stacks), noted by the shim.
static OWN: std::sync::Mutex<Vec<(u64, u64)>> = std::sync::Mutex::new(Vec::new());

/// Notes `[start, start+len)` as pagewise's own memory in this process (the
/// shim's heap, a thread's stack): left out of [`writable_anonymous`] here,
/// and named in the advice socket's hello so that no agent takes it for the
/// program's. Where the kernel names anonymous mappings they are also named
/// `[anon:pagewise-…]`; this works where it does not. At most [`MAX_OWN`]
/// ranges are kept.
pub fn note_own_memory(start: u64, len: u64) {
    let mut own = OWN.lock().unwrap_or_else(|e| e.into_inner());
    if own.len() < MAX_OWN as usize && len > 0 {
        own.push((start, len));
    }
}

/// The ranges [`note_own_memory`] noted.
pub fn own_memory() -> Vec<(u64, u64)> {
    OWN.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The writable private anonymous mappings of a process: what dirty tracking of
/// "a process" watches. pagewise's own memory in it (the preload shim's
/// heap, its threads' stacks: [`Mapping::is_pagewise`]) is not the program's
/// and is left out.
pub fn writable_anonymous(pid: Option<i32>) -> Result<Vec<Mapping>> {
    let own = if pid.is_none() {
        own_memory()
    } else {
        Vec::new()
    };
    Ok(only_writable_anonymous(maps(pid)?, &own))
}

/// [`writable_anonymous`] of another process's mappings as read.
pub(crate) fn writable_anonymous_of(maps: Vec<Mapping>) -> Vec<Mapping> {
    only_writable_anonymous(maps, &[])
}

/// The writable private anonymous mappings of `maps` that are not
/// pagewise's own, with the ranges `own` taken out of them: the kernel
/// merges a mapping of the program with one of the shim's beside it (the
/// shim's heap, say) into one line of the maps, and such a mapping was
/// once left out whole (the program's memory in it went untracked).
fn only_writable_anonymous(maps: Vec<Mapping>, own: &[(u64, u64)]) -> Vec<Mapping> {
    maps.into_iter()
        .filter(|m| m.write && m.is_anonymous() && !m.is_special() && !m.is_pagewise())
        .flat_map(|m| {
            outside_ranges(m.start, m.end, own)
                .into_iter()
                .map(move |(start, end)| Mapping {
                    start,
                    end,
                    ..m.clone()
                })
        })
        .collect()
}

/// The parts of `[start, end)` outside every range of `own` (address,
/// bytes), in order.
pub fn outside_ranges(start: u64, end: u64, own: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut cut: Vec<(u64, u64)> = own
        .iter()
        .map(|&(s, l)| (s.max(start), s.saturating_add(l).min(end)))
        .filter(|(a, e)| a < e)
        .collect();
    cut.sort_unstable();
    let mut out = Vec::new();
    let mut at = start;
    for (a, e) in cut {
        if a > at {
            out.push((at, a));
        }
        at = at.max(e);
    }
    if at < end {
        out.push((at, end));
    }
    out
}

/// A process's `/proc/PID/maps` kept open and read again from its start
/// at each [`MapsFile::read`] (the kernel makes its text afresh), with no
/// lookup of the path in `/proc` each time: what an agent reads of each
/// process at every step.
#[derive(Debug)]
pub(crate) struct MapsFile {
    pid: i32,
    file: std::fs::File,
    text: Vec<u8>,
}

impl MapsFile {
    /// Opens process `pid`'s maps.
    pub(crate) fn open(pid: i32) -> Result<MapsFile> {
        let path = proc_dir(Some(pid)).join("maps");
        let file = std::fs::File::open(&path)
            .map_err(|e| Error::for_pid(pid, format!("opening {}", path.display()), e))?;
        Ok(MapsFile {
            pid,
            file,
            text: Vec::new(),
        })
    }

    /// The process's mappings now. None at all once the address space the
    /// file was opened on is gone: the process ended, or replaced it by
    /// `exec` (open the file again).
    pub(crate) fn read(&mut self) -> Result<Vec<Mapping>> {
        use std::os::unix::fs::FileExt;
        // Read at offsets, from 0: no seek, and no `stat` for a size hint
        // (which the kernel's security hooks make dear, and a /proc file
        // answers with 0 anyway).
        self.text.clear();
        let mut chunk = [0u8; 16384];
        loop {
            let n = self
                .file
                .read_at(&mut chunk, self.text.len() as u64)
                .map_err(|e| Error::for_pid(self.pid, "reading its maps", e))?;
            if n == 0 {
                break;
            }
            self.text.extend_from_slice(&chunk[..n]);
        }
        Ok(parse_maps(&String::from_utf8_lossy(&self.text)))
    }
}

/// The writable mappings of a process that hold its state: private and shared,
/// anonymous and file-backed, without the kernel's special ones (`[vvar]`, …).
pub fn writable(pid: Option<i32>) -> Result<Vec<Mapping>> {
    Ok(maps(pid)?
        .into_iter()
        .filter(|m| m.read && m.write && !m.is_special())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn anon(start: u64, end: u64) -> Mapping {
        Mapping {
            start,
            end,
            read: true,
            write: true,
            exec: false,
            shared: false,
            offset: 0,
            inode: 0,
            path: String::new(),
        }
    }

    #[test]
    fn a_range_keeps_what_lies_outside_the_ranges_taken_out() {
        let own = [(0x5000, 0x2000), (0x1000, 0x1000), (0x9000, 0x4000)];
        assert_eq!(
            outside_ranges(0x0, 0xa000, &own),
            vec![(0x0, 0x1000), (0x2000, 0x5000), (0x7000, 0x9000)]
        );
        assert_eq!(outside_ranges(0x2000, 0x3000, &own), vec![(0x2000, 0x3000)]);
        assert!(outside_ranges(0x5000, 0x7000, &own).is_empty());
    }

    /// A mapping of the program merged with the shim's heap beside it
    /// keeps the program's part; one inside the shim's ranges is gone.
    #[test]
    fn the_shims_ranges_are_taken_out_of_a_mapping_not_the_mapping_whole() {
        let maps = vec![anon(0x1000, 0x9000), anon(0x20000, 0x22000)];
        let own = [(0x5000, 0x4000), (0x20000, 0x2000)];
        let got: Vec<(u64, u64)> = only_writable_anonymous(maps, &own)
            .iter()
            .map(|m| (m.start, m.end))
            .collect();
        assert_eq!(got, vec![(0x1000, 0x5000)]);
    }
}
