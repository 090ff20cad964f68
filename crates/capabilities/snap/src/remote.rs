//! Snapshots of another process into a durable store.
//!
//! The process is stopped (see [`pagewise_mech::stop`]) while its writable mappings
//! are read through `process_vm_readv`, and resumed before the snapshot is
//! synced to disk. Anonymous memory that was never populated is recorded as
//! zero pages without being read (`PAGEMAP_SCAN`); file-backed mappings are
//! read whole, since their unpopulated pages hold the file's contents. Pages
//! the store already has are not written again, so a series of snapshots
//! costs the pages that changed (plus an index of 8 bytes per page).

use super::disk::{DiskStore, SaveStats};
use crate::{Error, Result};
use pagewise_mech::procfs;
use pagewise_mech::remote;
use pagewise_mech::stop::Stopped;
use pagewise_mech::walk::PageWalker;
use pagewise_mech::{Region, PAGE_SIZE};
use serde::Serialize;
use std::time::Instant;

/// Bytes read per `process_vm_readv`.
const CHUNK: usize = 1 << 20;

/// What one snapshot of another process did.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ProcessSnapshot {
    /// What the store wrote.
    pub save: SaveStats,
    /// Mappings snapshotted.
    pub regions: usize,
    /// Pages read from the process.
    pub pages_read: u64,
    /// Threads stopped.
    pub threads: usize,
    /// How long the process was stopped, ms.
    pub stopped_ms: f64,
    /// The whole snapshot, ms (including the sync to disk).
    pub total_ms: f64,
}

/// Snapshots the writable memory of process `pid` into `disk`.
pub fn snapshot_process(pid: i32, disk: &mut DiskStore, label: &str) -> Result<ProcessSnapshot> {
    snapshot_with(pid, disk, label, None, Hold::Stop)
}

/// Successive snapshots of one process that read, after the first, only
/// the pages written since the previous one: a `uffd-wp` tracker from
/// outside ([`pagewise_track::DirtyTracker::for_process_sparse`]: a
/// sparse mapping costs what memory holds of it) runs alongside,
/// and is collected while the process is stopped for each snapshot. Of
/// what memory holds, pages it does not report are taken over from the
/// previous snapshot unread; a page memory does not hold is a zero page
/// (given back since, or never written). A mapping that is new, or
/// changed in place or size, is read as far as memory holds it; file-backed
/// mappings, which the tracker does not watch, are read whole.
pub struct Incremental {
    pid: i32,
    tracker: pagewise_track::DirtyTracker,
    prev: Option<super::disk::DiskSnapshot>,
}

impl Incremental {
    /// Starts tracking `pid` (refused, with the reason, where uffd-wp from
    /// outside cannot be had: use [`snapshot_process`] then).
    pub fn new(pid: i32) -> Result<Self> {
        // Holes neither protected nor scanned: each snapshot walks what
        // memory holds anyway, and learns there of a page given back.
        let tracker = pagewise_track::DirtyTracker::for_process_sparse(pid)?;
        Ok(Incremental {
            pid,
            tracker,
            prev: None,
        })
    }

    /// Takes the next snapshot into `disk` (the store of every earlier one).
    pub fn snapshot(&mut self, disk: &mut DiskStore, label: &str) -> Result<ProcessSnapshot> {
        let prev = self.prev.take();
        let s = snapshot_with(
            self.pid,
            disk,
            label,
            Some((&mut self.tracker, prev.as_ref())),
            Hold::Stop,
        )?;
        self.prev = Some(disk.load(s.save.id)?);
        Ok(s)
    }
}

/// Reads `[a, b)` of process `pid` through `buf` into the next pages of
/// `w`; returns how many.
fn read_into(
    pid: i32,
    w: &mut super::disk::SnapshotWriter<'_>,
    buf: &mut [u8],
    a: u64,
    b: u64,
) -> Result<u64> {
    let mut addr = a;
    while addr < b {
        let len = ((b - addr) as usize).min(buf.len());
        remote::read(pid, addr, &mut buf[..len])?;
        for page in buf[..len].chunks_exact(PAGE_SIZE) {
            w.push(page)?;
        }
        addr += len as u64;
    }
    Ok((b - a) / PAGE_SIZE as u64)
}

/// How a process is held while its snapshot is read.
#[derive(Clone, Copy)]
enum Hold<'a> {
    /// Stopped for the snapshot here.
    Stop,
    /// Held stopped by the caller (with others).
    Held(&'a Stopped),
    /// Running: a pre-copy, whose pages written meanwhile its tracker
    /// reports for the next snapshot (no threads' state is read).
    Running,
}

fn snapshot_with(
    pid: i32,
    disk: &mut DiskStore,
    label: &str,
    mut incremental: Option<(
        &mut pagewise_track::DirtyTracker,
        Option<&super::disk::DiskSnapshot>,
    )>,
    hold: Hold<'_>,
) -> Result<ProcessSnapshot> {
    let t0 = Instant::now();
    procfs::check_target(pid)?;
    not_self_served(pid)?;
    let own = match hold {
        Hold::Stop => Some(Stopped::new(pid)?),
        _ => None,
    };
    let stopped = match hold {
        Hold::Held(s) => Some(s),
        _ => own.as_ref(),
    };
    let threads = stopped.map_or(0, Stopped::threads);
    #[cfg(target_arch = "x86_64")]
    let record = stopped.and_then(|s| process_record(pid, s));
    let maps = procfs::writable(Some(pid))?;
    let regions: Vec<(Region, bool)> = maps
        .iter()
        .filter_map(|m| {
            Region::new(m.start, m.len())
                .ok()
                .map(|r| (r, m.inode == 0))
        })
        .collect();
    let only: Vec<Region> = regions.iter().map(|r| r.0).collect();
    // While stopped: what was written since the previous snapshot (and the
    // tracker re-armed for the next one).
    let (dirty, prev) = match incremental.as_mut() {
        Some((t, prev)) => {
            t.sync_process_mappings(Some(pid), false)?;
            (t.collect()?.ranges, *prev)
        }
        None => (Vec::new(), None),
    };
    let mut walker = PageWalker::new(Some(pid))?;
    let mut w = disk.writer(&only, Some(pid), label)?;
    let mut buf = vec![0u8; CHUNK];
    let mut runs = Vec::new();
    let mut pages_read = 0u64;
    for &(r, anonymous) in &regions {
        // The same mapping in the previous snapshot: its first entry.
        let before = prev
            .filter(|_| anonymous)
            .and_then(|p| p.first_page_of(&r).map(|i| (p, i)));
        if let Some((p, first)) = before {
            // What memory holds: a hole is a zero page now (given back
            // since, if the previous snapshot had data there; the sparse
            // tracker does not report that); a page it holds is read if
            // written since, taken over from `p` otherwise.
            walker.populated(r, &mut runs)?;
            let mut cursor = r.start;
            let index = |addr: u64| first + ((addr - r.start) / PAGE_SIZE as u64) as usize;
            for &(a, b) in &runs {
                w.push_zeros((a - cursor) / PAGE_SIZE as u64)?;
                let mut x = a;
                let k = dirty.partition_point(|d| d.end() <= a);
                for d in dirty[k..].iter().take_while(|d| d.start < b) {
                    let (da, db) = (d.start.max(x), d.end().min(b));
                    if da >= db {
                        continue;
                    }
                    for i in index(x)..index(da) {
                        w.push_unchanged(p, i)?;
                    }
                    pages_read += read_into(pid, &mut w, &mut buf, da, db)?;
                    x = db;
                }
                for i in index(x)..index(b) {
                    w.push_unchanged(p, i)?;
                }
                cursor = b;
            }
            w.push_zeros((r.end() - cursor) / PAGE_SIZE as u64)?;
            continue;
        }
        if anonymous {
            walker.populated(r, &mut runs)?;
        } else {
            runs.clear();
            runs.push((r.start, r.end()));
        }
        let mut cursor = r.start;
        for &(a, b) in &runs {
            w.push_zeros((a - cursor) / PAGE_SIZE as u64)?;
            pages_read += read_into(pid, &mut w, &mut buf, a, b)?;
            cursor = b;
        }
        w.push_zeros((r.end() - cursor) / PAGE_SIZE as u64)?;
    }
    #[cfg(target_arch = "x86_64")]
    if let Some(r) = &record {
        w.process_record(r);
    }
    drop(own);
    let stopped_ms = t0.elapsed().as_secs_f64() * 1e3;
    let save = w.finish()?;
    Ok(ProcessSnapshot {
        save,
        regions: regions.len(),
        pages_read,
        threads,
        stopped_ms,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Refuses a process that serves its own page faults (a userfaultfd of its
/// own over some of its memory): stopped, it could not serve the reads of
/// a snapshot, and the pages it keeps elsewhere are not at their
/// addresses. Every snapshot of another process asks (plain, live,
/// held for rollback).
pub(crate) fn not_self_served(pid: i32) -> Result<()> {
    let served = procfs::uffd_served(Some(pid))?;
    if served.is_empty() {
        return Ok(());
    }
    Err(Error::ServesOwnFaults {
        pid,
        mappings: served.len(),
    })
}

/// [`not_self_served`], and refuses a process that holds a userfaultfd of
/// its own: for what registers the process's memory with pagewise's (live
/// snapshots, held sessions), which would make the program's own
/// registrations fail.
pub(crate) fn may_register(pid: i32) -> Result<()> {
    not_self_served(pid)?;
    if procfs::owns_userfaultfd(pid) {
        return Err(Error::HoldsUserfaultfd { pid });
    }
    Ok(())
}

/// What a rollback needs besides pages (the layout, the program break,
/// every thread's state, the start time), read while `stopped`; `None`
/// where nothing can be done inside the process (seccomp filters pagewise
/// cannot step around, for one): its snapshot then restores memory alone.
#[cfg(target_arch = "x86_64")]
fn process_record(pid: i32, stopped: &Stopped) -> Option<super::disk::ProcessRecord> {
    // Seccomp filters that pagewise cannot step around could refuse the
    // calls made inside, or kill it.
    pagewise_mech::seccomp::check(pid, "a full snapshot", "the calls a rollback makes").ok()?;
    let layout = crate::layout::read(Some(pid)).ok()?;
    let (brk, threads) = super::process::inside_state(stopped).ok()?;
    Some(super::disk::ProcessRecord {
        start_time: procfs::start_time(pid)?,
        brk: Some(brk),
        layout,
        threads,
        fds: procfs::descriptors(pid).ok(),
        identity: procfs::exec_identity(pid),
    })
}

/// One snapshot of every process of a group (a container), all stopped at
/// one instant ([`pagewise_mech::stop::StoppedGroup`]): one snapshot in
/// the store per process, consecutive, each with the process's pid.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct GroupSnapshot {
    /// Each process's snapshot, in pid order.
    pub members: Vec<MemberSnapshot>,
    /// The cgroup frozen to stop them at one instant, if one was (the
    /// processes were stopped one after another otherwise).
    pub frozen: Option<std::path::PathBuf>,
    /// How long the processes were stopped (every snapshot saved before
    /// they ran on), ms.
    pub stopped_ms: f64,
    /// With a pre-copy while they ran (`snapshot --live`): the pages it
    /// read, all processes together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precopy_pages_read: Option<u64>,
}

/// One process's part of a [`GroupSnapshot`].
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct MemberSnapshot {
    /// Its pid on the host.
    pub pid: i32,
    /// Its pid inside its pid namespace.
    pub ns_pid: Option<i32>,
    /// Its snapshot.
    pub snapshot: ProcessSnapshot,
}

/// Snapshots every process `list` names into `disk`, all stopped at one
/// instant (`list` is asked again while they are, see
/// [`pagewise_mech::stop::StoppedGroup`]) and resumed together once every
/// one is saved.
pub fn snapshot_group(
    list: &dyn Fn() -> pagewise_mech::Result<Vec<i32>>,
    disk: &mut DiskStore,
    label: &str,
) -> Result<GroupSnapshot> {
    IncrementalGroup::without_tracking().snapshot(list, disk, label)
}

/// Successive snapshots of a group, each taken with every process
/// stopped at one instant (as [`snapshot_group`]), and, after a process's
/// first, reading only the pages it wrote since its previous one (as
/// [`Incremental`]): each process is tracked from outside while the group
/// runs, its tracker collected while the group is stopped. A process that
/// joins the group is read whole the first time and tracked from then on
/// (tracking starts once the group runs again, so its second snapshot is
/// read whole too); one whose tracking cannot be had (or fails) is read
/// whole every time.
pub struct IncrementalGroup {
    /// Per process: its tracking, and its last snapshot since tracking
    /// began. `None`: plain snapshots only.
    members: Option<std::collections::HashMap<i32, Incremental>>,
}

impl IncrementalGroup {
    /// Every snapshot read whole.
    pub fn without_tracking() -> Self {
        IncrementalGroup { members: None }
    }

    /// Snapshots after the first read what was written since; tracking
    /// starts now for the processes `pids` (each stopped a moment).
    pub fn new(pids: &[i32]) -> Self {
        let mut members = std::collections::HashMap::new();
        for &pid in pids {
            if let Ok(inc) = Incremental::new(pid) {
                members.insert(pid, inc);
            }
        }
        IncrementalGroup {
            members: Some(members),
        }
    }

    /// A pre-copy: each tracked process read into `disk` while it runs
    /// (its tracker collected first, so what it writes meanwhile is read
    /// again by the next [`snapshot`](Self::snapshot), taken with the
    /// group stopped, which then reads little). The pages read; a process
    /// whose read fails (a mapping gone under it) is read whole next time.
    pub fn precopy(&mut self, disk: &mut DiskStore, label: &str) -> u64 {
        let Some(m) = self.members.as_mut() else {
            return 0;
        };
        let mut pages = 0;
        for (&pid, inc) in m.iter_mut() {
            let prev = inc.prev.take();
            let tracked = Some((&mut inc.tracker, prev.as_ref()));
            if let Ok(r) = snapshot_with(pid, disk, label, tracked, Hold::Running) {
                pages += r.pages_read;
                inc.prev = disk.load(r.save.id).ok();
            }
        }
        pages
    }

    /// Takes the next snapshot of the group into `disk` (the store of every
    /// earlier one); see [`snapshot_group`].
    pub fn snapshot(
        &mut self,
        list: &dyn Fn() -> pagewise_mech::Result<Vec<i32>>,
        disk: &mut DiskStore,
        label: &str,
    ) -> Result<GroupSnapshot> {
        let t0 = Instant::now();
        let group = pagewise_mech::stop::StoppedGroup::new(list, pagewise_mech::stop::STOP_WAIT)?;
        let mut members = Vec::new();
        for s in group.members() {
            let pid = s.pid();
            let tracked = self.members.as_mut().and_then(|m| m.get_mut(&pid));
            let snapshot = match tracked {
                Some(inc) => {
                    let prev = inc.prev.take();
                    let r = snapshot_with(
                        pid,
                        disk,
                        label,
                        Some((&mut inc.tracker, prev.as_ref())),
                        Hold::Held(s),
                    );
                    match r {
                        Ok(r) => {
                            inc.prev = disk.load(r.save.id).ok();
                            r
                        }
                        // Its tracking failed (it replaced its program):
                        // read whole, and no longer tracked.
                        Err(_) => {
                            if let Some(m) = self.members.as_mut() {
                                m.remove(&pid);
                            }
                            snapshot_with(pid, disk, label, None, Hold::Held(s))?
                        }
                    }
                }
                None => snapshot_with(pid, disk, label, None, Hold::Held(s))?,
            };
            members.push(MemberSnapshot {
                pid,
                ns_pid: pagewise_mech::container::ns_pid(pid),
                snapshot,
            });
        }
        let frozen = group.frozen().map(std::path::Path::to_path_buf);
        drop(group);
        let stopped_ms = t0.elapsed().as_secs_f64() * 1e3;
        if let Some(m) = self.members.as_mut() {
            m.retain(|pid, _| members.iter().any(|x| x.pid == *pid));
            for x in &members {
                if let std::collections::hash_map::Entry::Vacant(e) = m.entry(x.pid) {
                    if let Ok(inc) = Incremental::new(x.pid) {
                        e.insert(inc);
                    }
                }
            }
        }
        Ok(GroupSnapshot {
            members,
            frozen,
            stopped_ms,
            precopy_pages_read: None,
        })
    }
}

/// Sends snapshot `id` of `disk` to `dest` as one pass of a live copy
/// (every region, every page), then completes and finishes it there: a
/// snapshot taken locally (a group's, at one instant) migrated whole to a
/// receiver. The process record stays behind, as for any live copy. What
/// the destination saved.
pub fn send_saved(
    disk: &DiskStore,
    id: u64,
    dest: &mut dyn super::live::Destination,
) -> Result<SaveStats> {
    let s = disk.load(id)?;
    let mut copy: Vec<(Region, Vec<u8>)> = Vec::with_capacity(s.regions.len());
    let mut page = 0usize;
    for r in &s.regions {
        let mut buf = vec![0u8; r.len as usize];
        for chunk in buf.chunks_exact_mut(PAGE_SIZE) {
            let entry = *s.entries.get(page).ok_or(Error::Internal {
                what: "a snapshot's index holds fewer pages than its regions",
            })?;
            disk.read_page(entry, chunk)?;
            page += 1;
        }
        copy.push((*r, buf));
    }
    let all: Vec<pagewise_mech::PageRange> = s
        .regions
        .iter()
        .map(|r| pagewise_mech::PageRange {
            start: r.start,
            pages: r.pages(),
        })
        .collect();
    dest.pass(&copy, &all)?;
    dest.complete()?;
    dest.finish(&copy, s.pid.unwrap_or(0), &s.label)
}
