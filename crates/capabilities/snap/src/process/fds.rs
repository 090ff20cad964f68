//! Descriptors in a rollback: the table recorded at a take
//! ([`procfs::descriptors`]) and put back at a restore, inside the process.
//!
//! A descriptor is the same at both times when its number refers to the
//! same object (device and inode). At a restore:
//!
//! - a descriptor **opened since** is closed inside the process, so that a
//!   peer sees its connection end and no epoll set keeps it (the program's
//!   memory, put back, no longer knows it); [`RestoreOptions::keep_new_fds`]
//!   leaves them open;
//! - a regular file open at both times gets its **offset** back, unless
//!   its open file description is held by a process outside the restore
//!   too (a shell's output, a log its parent writes: inherited across a
//!   `fork`, [`procfs::held_elsewhere`]), whose offset it is as well: that
//!   one is left as it is, and the report says so;
//! - a regular file or a directory **closed since** is opened again at its
//!   number, by its path (seen from the process's root), with its flags and
//!   offset, where the path still names the same inode (as CRIU reopens
//!   files);
//! - any other descriptor the snapshot had and the process no longer has (a
//!   socket, a pipe, an eventfd, a file deleted or replaced since) cannot be
//!   given back: the restore is refused before anything is changed, naming
//!   each ([`RollbackRefusal::DescriptorsGone`]), unless
//!   [`RestoreOptions::ignore_missing_fds`].
//!
//! Where nothing can be done inside the process, nothing is changed and
//! the report says what differs.

use super::{RestoreOptions, RollbackRefusal};
use crate::SnapId;
use crate::{Error, Result};
use pagewise_mech::inject::{failed, Remote};
use pagewise_mech::procfs::{self, Descriptor, FdKind};
use serde::Serialize;

/// One descriptor, as a report names it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, schemars::JsonSchema)]
#[non_exhaustive]
pub struct FdNote {
    /// Its number.
    pub fd: i32,
    /// What it refers to.
    pub kind: FdKind,
    /// What `/proc/PID/fd/N` reads (lossy UTF-8).
    pub target: String,
}

impl FdNote {
    fn of(d: &Descriptor) -> FdNote {
        FdNote {
            fd: d.fd,
            kind: d.kind,
            target: d.target_text(),
        }
    }
}

impl std::fmt::Display for FdNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = serde_json::to_value(self.kind)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        write!(f, "{} ({kind} {})", self.fd, self.target)
    }
}

/// What a restore did with descriptors.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct FdReport {
    /// Whether the snapshot holds a descriptor table (not one loaded from
    /// a store of format 3 or older): without one, nothing below is known.
    pub recorded: bool,
    /// Whether they were put back (calls could be made inside the
    /// process); otherwise the lists say what differs, and nothing changed.
    pub applied: bool,
    /// Opened since, closed inside the process.
    pub closed: Vec<FdNote>,
    /// Opened since, left open (asked, or nothing could be done inside).
    pub kept: Vec<FdNote>,
    /// Closed since, opened again at their number, path, flags and offset.
    pub reopened: Vec<FdNote>,
    /// Regular files open at both times whose offset was put back.
    pub rewound: Vec<FdNote>,
    /// Regular files open at both times whose open file description a
    /// process outside the restore holds too: their offset, that process's
    /// as well, left as it is.
    pub shared: Vec<FdNote>,
    /// Closed since and not given back.
    pub missing: Vec<FdNote>,
}

impl FdReport {
    /// The report as the older list had it: `+N` for each descriptor opened
    /// since, `-N` for each closed since.
    pub(crate) fn changes(&self) -> Vec<i64> {
        let opened = self.closed.iter().chain(&self.kept).map(|n| n.fd as i64);
        let gone = self
            .reopened
            .iter()
            .chain(&self.missing)
            .map(|n| -(n.fd as i64));
        opened.chain(gone).collect()
    }
}

/// What a restore will do with descriptors, decided before anything is
/// changed.
#[derive(Debug, Default)]
pub(super) struct Plan {
    close: Vec<Descriptor>,
    keep: Vec<Descriptor>,
    reopen: Vec<Descriptor>,
    rewind: Vec<Descriptor>,
    shared: Vec<Descriptor>,
    missing: Vec<Descriptor>,
    recorded: bool,
}

/// Whether the file `d` named is still at its path, seen from process
/// `pid`'s root.
fn still_there(pid: i32, d: &Descriptor) -> bool {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::MetadataExt;
    if !d.target.starts_with(b"/") || d.target.ends_with(b" (deleted)") {
        return false;
    }
    let mut path = format!("/proc/{pid}/root").into_bytes();
    path.extend_from_slice(&d.target);
    let path = std::path::Path::new(std::ffi::OsStr::from_bytes(&path));
    std::fs::metadata(path).is_ok_and(|m| m.dev() == d.dev && m.ino() == d.ino)
}

/// The plan for a restore of snapshot `id` of process `pid`, whose table
/// was `then` (if recorded) and is `now`; refused where descriptors are
/// gone and `opts` does not allow it and calls can be made inside.
/// `group`: the processes restored with it, whose holding a description
/// does not make it shared.
pub(super) fn plan(
    pid: i32,
    id: SnapId,
    then: Option<&[Descriptor]>,
    now: &[Descriptor],
    opts: RestoreOptions,
    inside: bool,
    group: &[i32],
) -> Result<Plan> {
    let Some(then) = then else {
        return Ok(Plan::default());
    };
    let mut p = Plan {
        recorded: true,
        ..Plan::default()
    };
    for d in now {
        match then.iter().find(|t| t.same(d)) {
            Some(t) if t.kind == FdKind::File && t.pos != d.pos => p.rewind.push(t.clone()),
            Some(_) => {}
            None if opts.keep_new_fds || !inside => p.keep.push(d.clone()),
            None => p.close.push(d.clone()),
        }
    }
    // An offset another process shares is left to it.
    let moved: Vec<&Descriptor> = now
        .iter()
        .filter(|d| p.rewind.iter().any(|t| t.fd == d.fd))
        .collect();
    let held = procfs::held_elsewhere(pid, &moved, group);
    (p.shared, p.rewind) = std::mem::take(&mut p.rewind)
        .into_iter()
        .partition(|t| held.contains(&t.fd));
    for t in then {
        if now.iter().any(|d| d.same(t)) {
            continue;
        }
        // Its number must be free once the new ones are closed.
        let free = !p.keep.iter().any(|k| k.fd == t.fd);
        let reopenable = matches!(t.kind, FdKind::File | FdKind::Directory);
        if inside && free && reopenable && still_there(pid, t) {
            p.reopen.push(t.clone());
        } else {
            p.missing.push(t.clone());
        }
    }
    if inside && !p.missing.is_empty() && !opts.ignore_missing_fds {
        // A process in `exit` has closed them all.
        if procfs::is_ending(pid) {
            return Err(pagewise_mech::Error::ProcessExited(pid).into());
        }
        return Err(RollbackRefusal::DescriptorsGone {
            pid,
            id,
            gone: p
                .missing
                .iter()
                .map(|d| FdNote::of(d).to_string())
                .collect(),
        }
        .into());
    }
    Ok(p)
}

/// A call inside the process that must succeed.
fn call(remote: &Remote<'_>, pid: i32, what: String, nr: i64, args: [u64; 6]) -> Result<i64> {
    let rc = remote.syscall(nr, args)?;
    if rc < 0 {
        return Err(failed(pid, what, rc).into());
    }
    Ok(rc)
}

/// Opens `d` again at its number inside the process, with its flags and
/// offset.
fn reopen(remote: &Remote<'_>, pid: i32, d: &Descriptor) -> Result<()> {
    let keep = !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY);
    let flags = (d.flags as i32 & keep) | libc::O_CLOEXEC;
    let what = || format!("opening {} again as descriptor {}", d.target_text(), d.fd);
    let fd = remote.open(&d.target, flags)?;
    if fd < 0 {
        return Err(failed(pid, what(), fd).into());
    }
    let cloexec = d.flags as i32 & libc::O_CLOEXEC;
    if fd != d.fd as i64 {
        let moved = remote.syscall(
            libc::SYS_dup3,
            [fd as u64, d.fd as u64, cloexec as u64, 0, 0, 0],
        );
        call(
            remote,
            pid,
            what(),
            libc::SYS_close,
            [fd as u64, 0, 0, 0, 0, 0],
        )?;
        let moved = moved?;
        if moved < 0 {
            return Err(failed(pid, what(), moved).into());
        }
    } else if cloexec == 0 {
        call(
            remote,
            pid,
            what(),
            libc::SYS_fcntl,
            [fd as u64, libc::F_SETFD as u64, 0, 0, 0, 0],
        )?;
    }
    if d.kind == FdKind::File {
        seek(remote, pid, d)?;
    }
    Ok(())
}

fn seek(remote: &Remote<'_>, pid: i32, d: &Descriptor) -> Result<()> {
    call(
        remote,
        pid,
        format!("lseek of descriptor {} to {}", d.fd, d.pos),
        libc::SYS_lseek,
        [d.fd as u64, d.pos, libc::SEEK_SET as u64, 0, 0, 0],
    )
    .map(|_| ())
}

/// Carries `plan` out inside the process (`remote`, when calls can be
/// made there); what was done.
pub(super) fn apply(remote: Option<&Remote<'_>>, pid: i32, plan: Plan) -> Result<FdReport> {
    let notes = |v: &[Descriptor]| v.iter().map(FdNote::of).collect::<Vec<_>>();
    let mut r = FdReport {
        recorded: plan.recorded,
        applied: remote.is_some() && plan.recorded,
        kept: notes(&plan.keep),
        shared: notes(&plan.shared),
        missing: notes(&plan.missing),
        ..FdReport::default()
    };
    let Some(remote) = remote else {
        // Nothing changed: what differs is what was opened and closed.
        r.kept.extend(notes(&plan.close));
        r.missing.extend(notes(&plan.reopen));
        return Ok(r);
    };
    for d in &plan.close {
        call(
            remote,
            pid,
            format!("closing descriptor {}", d.fd),
            libc::SYS_close,
            [d.fd as u64, 0, 0, 0, 0, 0],
        )?;
        r.closed.push(FdNote::of(d));
    }
    for d in &plan.reopen {
        reopen(remote, pid, d)?;
        r.reopened.push(FdNote::of(d));
    }
    for d in &plan.rewind {
        seek(remote, pid, d)?;
        r.rewound.push(FdNote::of(d));
    }
    if !plan.reopen.is_empty() {
        // Each number names the inode it did (a path replaced meanwhile
        // is an error, not a wrong file).
        let now = procfs::descriptors(pid)?;
        for d in &plan.reopen {
            if !now.iter().any(|n| n.same(d)) {
                return Err(Error::DescriptorReplaced {
                    pid,
                    fd: d.fd,
                    path: d.target_text(),
                });
            }
        }
    }
    Ok(r)
}
