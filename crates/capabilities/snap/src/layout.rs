//! A process's address-space layout, and the calls that make it what it
//! was: which mappings exist, with which protection and backing; what
//! changed between two layouts; and the `munmap`, `mmap` and `mprotect`
//! calls, made inside the stopped process ([`Remote`]), that put a layout
//! back.
//!
//! The kernel's special mappings (`[vdso]`, `[vvar]`, `[vsyscall]`,
//! `[uprobes]`) and pagewise's own (`[anon:pagewise-…]`) are not part of
//! a layout: they are never touched. Two layouts are compared page range by
//! page range, not mapping by mapping: the kernel splits and merges
//! mappings on its own (an `mprotect` of part of one splits it), and what
//! matters is what each page is. A page mapped now and not then is
//! unmapped; a page mapped then and not now, or now backed by something
//! else, is mapped again (anonymous memory afresh, a file's at its offset:
//! its contents are the caller's to write); a page of the same backing
//! with another protection is re-protected. A shared anonymous mapping
//! (`MAP_SHARED|MAP_ANONYMOUS`, shmem, memfd) that is gone cannot be made
//! again: refused. The rest of a mapping's state is not compared: `madvise`
//! advice, locks, names of anonymous mappings, a stack's growing down.

use pagewise_mech::inject::{failed, Remote};

/// A call made inside the process that failed, as this crate's error.
fn failed_inside(pid: i32, what: impl Into<String>, rc: i64) -> Error {
    failed(pid, what, rc).into()
}
use crate::{Error, Result};
use pagewise_mech::procfs::{self, Mapping};

/// What backs a mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory (the heap and stacks among it).
    Anonymous,
    /// A file, by path and inode; the offset is the [`Vma`]'s.
    File {
        /// As `/proc/PID/maps` names it.
        path: String,
        /// Its inode.
        inode: u64,
    },
    /// Shared anonymous memory or a file that cannot be opened by name
    /// (deleted, a memfd, SysV shared memory), by its name in the maps.
    Other(String),
}

/// One mapping of a layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    /// Start address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `PROT_READ | PROT_WRITE | PROT_EXEC`.
    pub prot: i32,
    /// `MAP_SHARED` rather than `MAP_PRIVATE`.
    pub shared: bool,
    /// What backs it.
    pub backing: Backing,
    /// File offset of `start` (0 for anonymous memory).
    pub offset: u64,
}

impl Vma {
    /// From a line of the maps.
    pub fn of(m: &Mapping) -> Vma {
        let prot = (if m.read { libc::PROT_READ } else { 0 })
            | (if m.write { libc::PROT_WRITE } else { 0 })
            | (if m.exec { libc::PROT_EXEC } else { 0 });
        let backing = if m.is_anonymous() {
            Backing::Anonymous
        } else if m.inode != 0 && m.path.starts_with('/') && !m.path.ends_with(" (deleted)") {
            Backing::File {
                path: m.path.clone(),
                inode: m.inode,
            }
        } else {
            Backing::Other(m.path.clone())
        };
        Vma {
            start: m.start,
            end: m.end,
            prot,
            shared: m.shared,
            offset: if backing == Backing::Anonymous {
                0
            } else {
                m.offset
            },
            backing,
        }
    }

    /// Whether the page at `addr` (inside both) holds the same thing in
    /// `self` as in `other`, whatever their protections.
    fn same_backing_at(&self, other: &Vma, addr: u64) -> bool {
        self.shared == other.shared
            && self.backing == other.backing
            && (self.backing == Backing::Anonymous
                || self.offset + (addr - self.start) == other.offset + (addr - other.start))
    }

    /// Whether its pages are a snapshot's to save and a rollback's to write:
    /// private and writable.
    pub(crate) fn is_private_writable(&self) -> bool {
        !self.shared && self.prot & libc::PROT_WRITE != 0
    }
}

/// The layout of process `pid` (`None`: the calling process), without the
/// special mappings and pagewise's own.
pub fn read(pid: Option<i32>) -> Result<Vec<Vma>> {
    Ok(procfs::maps(pid)?
        .iter()
        .filter(|m| !m.is_special() && !m.is_pagewise())
        .map(Vma::of)
        .collect())
}

/// One call that makes a layout more like another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `munmap` of `[start, end)`.
    Unmap {
        /// Start.
        start: u64,
        /// End.
        end: u64,
    },
    /// `mmap(MAP_FIXED)` of `[start, end)` as `like` has it.
    Map {
        /// Start.
        start: u64,
        /// End.
        end: u64,
        /// The mapping of the wanted layout it is part of.
        like: Vma,
    },
    /// `mprotect` of `[start, end)`.
    Protect {
        /// Start.
        start: u64,
        /// End.
        end: u64,
        /// The protection.
        prot: i32,
    },
}

impl Op {
    /// The range it acts on.
    pub fn range(&self) -> (u64, u64) {
        match *self {
            Op::Unmap { start, end }
            | Op::Map { start, end, .. }
            | Op::Protect { start, end, .. } => (start, end),
        }
    }
}

fn covering(layout: &[Vma], addr: u64) -> Option<&Vma> {
    let i = layout.partition_point(|v| v.end <= addr);
    layout.get(i).filter(|v| v.start <= addr)
}

/// The calls that make layout `have` into `want` (both sorted by address,
/// as read). Refused where `want` has a mapping that cannot be made again
/// (see the module).
pub fn diff(want: &[Vma], have: &[Vma]) -> Result<Vec<Op>> {
    let mut cuts: Vec<u64> = want
        .iter()
        .chain(have)
        .flat_map(|v| [v.start, v.end])
        .collect();
    cuts.sort_unstable();
    cuts.dedup();
    let mut ops: Vec<Op> = Vec::new();
    for w in cuts.windows(2) {
        let (a, b) = (w[0], w[1]);
        let op = match (covering(want, a), covering(have, a)) {
            (None, None) => continue,
            (None, Some(_)) => Op::Unmap { start: a, end: b },
            (Some(x), Some(y)) if x.same_backing_at(y, a) => {
                if x.prot == y.prot {
                    continue;
                }
                Op::Protect {
                    start: a,
                    end: b,
                    prot: x.prot,
                }
            }
            (Some(x), _) => {
                if let Backing::Other(name) = &x.backing {
                    return Err(Error::MappingGone {
                        start: a,
                        end: b,
                        shared: x.shared,
                        name: name.clone(),
                    });
                }
                Op::Map {
                    start: a,
                    end: b,
                    like: x.clone(),
                }
            }
        };
        push_merged(&mut ops, op);
    }
    Ok(ops)
}

/// Appends `op`, merged with the last one where they are one call.
fn push_merged(ops: &mut Vec<Op>, op: Op) {
    if let Some(last) = ops.last_mut() {
        let merged = match (&*last, &op) {
            (Op::Unmap { start, end }, Op::Unmap { start: s, end: e }) if end == s => {
                Some(Op::Unmap {
                    start: *start,
                    end: *e,
                })
            }
            (
                Op::Protect { start, end, prot },
                Op::Protect {
                    start: s,
                    end: e,
                    prot: p,
                },
            ) if end == s && prot == p => Some(Op::Protect {
                start: *start,
                end: *e,
                prot: *prot,
            }),
            (
                Op::Map { start, end, like },
                Op::Map {
                    start: s,
                    end: e,
                    like: l,
                },
            ) if end == s && like == l => Some(Op::Map {
                start: *start,
                end: *e,
                like: like.clone(),
            }),
            _ => None,
        };
        if let Some(m) = merged {
            *last = m;
            return;
        }
    }
    ops.push(op);
}

/// A call made inside process `pid` that answered `rc`, a negative errno.
/// Makes `ops` inside the stopped process of `remote`, in order.
pub fn apply(remote: &Remote<'_>, pid: i32, ops: &[Op]) -> Result<()> {
    for op in ops {
        match op {
            Op::Unmap { start, end } => {
                let rc = remote.syscall(libc::SYS_munmap, [*start, end - start, 0, 0, 0, 0])?;
                if rc < 0 {
                    return Err(failed_inside(
                        pid,
                        format!("munmap({start:#x}..{end:#x}) made inside it"),
                        rc,
                    ));
                }
            }
            Op::Protect { start, end, prot } => {
                let rc = remote.syscall(
                    libc::SYS_mprotect,
                    [*start, end - start, *prot as u64, 0, 0, 0],
                )?;
                if rc < 0 {
                    return Err(failed_inside(
                        pid,
                        format!("mprotect({start:#x}..{end:#x}) made inside it"),
                        rc,
                    ));
                }
            }
            Op::Map { start, end, like } => map(remote, pid, *start, *end, like)?,
        }
    }
    Ok(())
}

/// `mmap(MAP_FIXED)` of `[start, end)` as `like` has it, inside the target;
/// a file is opened there by its path ([`Remote::open`]) and closed after.
fn map(remote: &Remote<'_>, pid: i32, start: u64, end: u64, like: &Vma) -> Result<()> {
    let len = end - start;
    let share = if like.shared {
        libc::MAP_SHARED
    } else {
        libc::MAP_PRIVATE
    };
    let Backing::File { path, .. } = &like.backing else {
        let rc = remote.syscall(
            libc::SYS_mmap,
            [
                start,
                len,
                like.prot as u64,
                (share | libc::MAP_ANONYMOUS | libc::MAP_FIXED) as u64,
                u64::MAX,
                0,
            ],
        )?;
        return match rc {
            rc if rc < 0 => Err(failed_inside(
                pid,
                format!("mmap({start:#x}..{end:#x}) made inside it"),
                rc,
            )),
            _ => Ok(()),
        };
    };
    let write = like.shared && like.prot & libc::PROT_WRITE != 0;
    let flags = libc::O_CLOEXEC | if write { libc::O_RDWR } else { libc::O_RDONLY };
    let opened = remote.open(path.as_bytes(), flags);
    let fd = opened?;
    if fd < 0 {
        return Err(failed_inside(pid, format!("opening {path} inside it"), fd));
    }
    let offset = like.offset + (start - like.start);
    let rc = remote.syscall(
        libc::SYS_mmap,
        [
            start,
            len,
            like.prot as u64,
            (share | libc::MAP_FIXED) as u64,
            fd as u64,
            offset,
        ],
    );
    remote.syscall(libc::SYS_close, [fd as u64, 0, 0, 0, 0, 0])?;
    let rc = rc?;
    if rc < 0 {
        return Err(failed_inside(
            pid,
            format!("mmap of {path} at {start:#x}..{end:#x} made inside it"),
            rc,
        ));
    }
    Ok(())
}

/// Checks, before anything is changed, that every file `ops` maps again is
/// still the file it was (the same inode at the path, seen from the
/// target's root).
pub fn check(pid: i32, ops: &[Op]) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    for op in ops {
        let Op::Map { like, .. } = op else { continue };
        let Backing::File { path, inode } = &like.backing else {
            continue;
        };
        let seen = std::fs::metadata(format!("/proc/{pid}/root{path}")).map(|m| m.ino());
        if seen.as_ref().ok() != Some(inode) {
            return Err(Error::FileReplaced {
                path: path.to_string(),
                start: like.start,
                end: like.end,
                then: *inode,
                now: seen.ok(),
            });
        }
    }
    Ok(())
}

/// `brk(addr)` inside the target; the break it answers (the old one when
/// the kernel refuses).
pub fn brk(remote: &Remote<'_>, addr: u64) -> Result<u64> {
    Ok(remote.syscall(libc::SYS_brk, [addr, 0, 0, 0, 0, 0])? as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: u64 = 0x1000;

    fn anon(start: u64, end: u64, prot: i32) -> Vma {
        Vma {
            start: start * P,
            end: end * P,
            prot,
            shared: false,
            backing: Backing::Anonymous,
            offset: 0,
        }
    }

    fn file(start: u64, end: u64, offset: u64) -> Vma {
        Vma {
            start: start * P,
            end: end * P,
            prot: libc::PROT_READ,
            shared: false,
            backing: Backing::File {
                path: "/lib/x.so".into(),
                inode: 7,
            },
            offset: offset * P,
        }
    }

    const RW: i32 = libc::PROT_READ | libc::PROT_WRITE;

    #[test]
    fn equal_layouts_need_nothing_however_split() {
        let want = vec![anon(1, 9, RW), file(10, 12, 0)];
        assert!(diff(&want, &want).unwrap().is_empty());
        // The kernel split one mapping in two of the same kind: the same pages.
        let have = vec![
            anon(1, 4, RW),
            anon(4, 9, RW),
            file(10, 11, 0),
            file(11, 12, 1),
        ];
        assert!(diff(&want, &have).unwrap().is_empty());
    }

    #[test]
    fn each_change_is_undone_by_its_call() {
        let want = vec![anon(1, 9, RW), file(10, 12, 0)];
        // Made since, grown: unmapped.
        let have = vec![anon(1, 9, RW), file(10, 12, 0), anon(20, 22, RW)];
        assert_eq!(
            diff(&want, &have).unwrap(),
            vec![Op::Unmap {
                start: 20 * P,
                end: 22 * P
            }]
        );
        let have = vec![anon(1, 12 - 3, RW), anon(9, 10, RW), file(10, 12, 0)];
        assert_eq!(
            diff(&want, &have).unwrap(),
            vec![Op::Unmap {
                start: 9 * P,
                end: 10 * P
            }]
        );
        // Removed, shrunk: mapped again as it was.
        let have = vec![anon(1, 5, RW), file(10, 12, 0)];
        assert_eq!(
            diff(&want, &have).unwrap(),
            vec![Op::Map {
                start: 5 * P,
                end: 9 * P,
                like: anon(1, 9, RW)
            }]
        );
        // Re-protected in part: that part protected again.
        let have = vec![
            anon(1, 3, RW),
            anon(3, 6, libc::PROT_READ),
            anon(6, 9, RW),
            file(10, 12, 0),
        ];
        assert_eq!(
            diff(&want, &have).unwrap(),
            vec![Op::Protect {
                start: 3 * P,
                end: 6 * P,
                prot: RW
            }]
        );
        // Moved (mremap): the old place mapped, the new one unmapped.
        let have = vec![file(10, 12, 0), anon(30, 38, RW)];
        assert_eq!(
            diff(&want, &have).unwrap(),
            vec![
                Op::Map {
                    start: P,
                    end: 9 * P,
                    like: anon(1, 9, RW)
                },
                Op::Unmap {
                    start: 30 * P,
                    end: 38 * P
                }
            ]
        );
        // A file's pages at another offset, or anonymous memory in their
        // place: mapped again from the file.
        let have = vec![anon(1, 9, RW), file(10, 12, 4)];
        assert_eq!(
            diff(&want, &have).unwrap(),
            vec![Op::Map {
                start: 10 * P,
                end: 12 * P,
                like: file(10, 12, 0)
            }]
        );
    }

    #[test]
    fn shared_memory_that_is_gone_is_refused() {
        let shm = Vma {
            start: P,
            end: 3 * P,
            prot: RW,
            shared: true,
            backing: Backing::Other("/dev/zero (deleted)".into()),
            offset: 0,
        };
        let e = diff(std::slice::from_ref(&shm), &[]).unwrap_err();
        assert!(
            matches!(&e, Error::MappingGone { start: P, end, shared: true, name } if *end == 3 * P && name == "/dev/zero (deleted)"),
            "{e}"
        );
        // Still there: nothing to do.
        assert!(diff(std::slice::from_ref(&shm), std::slice::from_ref(&shm))
            .unwrap()
            .is_empty());
    }
}
