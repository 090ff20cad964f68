//! Rollback of another process in place: [`ProcessSnapshots`] takes
//! snapshots of a running process and puts any of them back, any number
//! of times, in any order.
//!
//! While the handle is open the process is tracked from outside with
//! userfaultfd write-protect ([`pagewise_mech::wp::UffdWp::open_in`], the
//! mechanism of `track --pid`), over every private writable mapping
//! (anonymous or a file's copy-on-write pages): a take reads, and a restore
//! writes, only the pages written since the last take or restore, plus
//! those whose contents differ between what memory held then and the
//! snapshot. Nothing scans or hashes the whole memory after the first take.
//!
//! What a snapshot holds, and a restore puts back:
//! - every page of every private writable mapping, byte for byte;
//! - **the layout** ([`crate::layout`]): mappings made since are
//!   unmapped; mappings removed, shrunk, grown, moved or re-protected since
//!   are made as they were; the program break;
//! - **every thread's state** ([`crate::threads`]): registers, the
//!   `XSAVE` area, `fs`/`gs` bases, signal mask, alternate signal stack; a
//!   thread caught in a system call makes it again.
//!
//! The kernel's rseq area of each thread (the CPU it runs on) is put back
//! as taken, and written by the kernel again as soon as the thread runs.
//!
//! - **descriptors** ([`fds`]): those opened since are closed, those
//!   closed since opened again where they are files, the offsets of files
//!   put back; a restore is refused where one the snapshot had is gone for
//!   good (a socket, a pipe).
//!
//! Not put back: pending signals, the files themselves, shared memory (a
//! restore would change it under every other process that maps it; it is
//! left as it is), hugetlb memory.
//!
//! The thread set must be the snapshot's: a thread made or ended since is
//! refused ([`RollbackRefusal::ThreadsChanged`]), and so is one that had
//! not registered its rseq area at the snapshot and has since (it would
//! register it again, which the kernel refuses), unless the restore is
//! memory-only ([`RestoreOptions::memory_only`]: memory and layout, not
//! registers). Where nothing can be done inside the process (a seccomp
//! filter, another tracer), only memory can be put back: the handle still
//! opens ([`ProcessSnapshots::open`] says why in
//! [`ProcessSnapshots::note`]), a restore must be memory-only, the layout
//! must be the snapshot's, and every page is compared by digest.
//!
//! The process is stopped (every thread, [`pagewise_mech::stop`]) for each
//! take and restore and left as it was found: a process its user stopped
//! stays stopped, nothing stays registered after the handle is dropped.

pub mod afl;
pub mod fds;
pub mod group;
pub mod inside;
mod memory;
pub mod session;
mod store;
mod thread_memory;

use super::table::{self, Chunk, Table};
use super::{PageStore, RestoreStats, SnapId, TakeStats};
pub use crate::error::RollbackRefusal;
use crate::layout::{self, Op, Vma};
use crate::threads::{self, ThreadState};
use crate::{Error, Result};
use pagewise_mech::inject::Remote;
use pagewise_mech::procfs;
use pagewise_mech::region::{push_coalesced, PageRange};
use pagewise_mech::stop::Stopped;
use pagewise_mech::wp::UffdWp;
use pagewise_mech::Error as MechError;
use pagewise_mech::{Region, PAGE_SIZE};
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Pages per `process_vm_readv`/`process_vm_writev` (each page its own
/// local buffer; `IOV_MAX` is 1,024).
const BATCH: usize = 1024;

/// How to restore.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct RestoreOptions {
    /// Put back memory (and the layout where calls can be made inside the
    /// process), not the threads' registers.
    pub memory_only: bool,
    /// Leave open the descriptors opened since the snapshot (they are
    /// closed by default).
    pub keep_new_fds: bool,
    /// Restore even where descriptors the snapshot had are gone for good
    /// (they stay closed).
    pub ignore_missing_fds: bool,
}

setters!(RestoreOptions {
    memory_only: bool,
    keep_new_fds: bool,
    ignore_missing_fds: bool
});

/// What one restore did.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RestoreReport {
    /// Pages and time, as for own regions.
    #[serde(flatten)]
    pub stats: RestoreStats,
    /// Mapping calls made to put the layout back.
    pub layout_calls: u64,
    /// Threads whose state was put back.
    pub threads: u64,
    /// Descriptors opened (`+N`) or closed (`-N`) since the snapshot
    /// (empty where the snapshot holds no descriptor table); what was done
    /// with each is in `fds`.
    pub fd_changes: Vec<i64>,
    /// What was done with descriptors.
    pub fds: fds::FdReport,
    /// Whether pages were compared by digest (no tracking: memory-only
    /// without calls inside the process).
    pub compared: bool,
    /// Memory-only: the mappings left as they are because a thread runs
    /// on them (its stack, its thread-control block and thread-local
    /// data), `[start, end]`.
    pub thread_areas: Vec<[u64; 2]>,
    /// Where the time went.
    pub phases: RestorePhases,
}

/// Where the time of one restore went, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct RestorePhases {
    /// Stopping every thread and checking the process.
    pub stop_us: f64,
    /// Preparing calls inside it, the break and the mappings.
    pub layout_us: f64,
    /// The threads' states.
    pub threads_us: f64,
    /// Finding the pages written since (the page-table walk).
    pub walk_us: f64,
    /// Writing pages and protecting them again.
    pub copy_us: f64,
    /// Descriptors compared and every thread let go.
    pub resume_us: f64,
}

fn us_since(t: &mut Instant) -> f64 {
    let now = Instant::now();
    // To a tenth of a microsecond, which is what a clock read costs.
    let d = ((now - *t).as_secs_f64() * 1e7).round() / 10.0;
    *t = now;
    d
}

/// A memory phase's time since `t` (which becomes now), split into the
/// walk's `walk_ns` and the rest (the copy), microseconds to a tenth.
fn walk_and_copy_us(walk_ns: u64, t: &mut Instant) -> (f64, f64) {
    let walk = (walk_ns as f64 / 100.0).round() / 10.0;
    (walk, ((us_since(t) - walk) * 10.0).round() / 10.0)
}

/// One mapping's pages as memory held them at the last take or restore.
struct Known {
    region: Region,
    table: Table,
    /// Registered with the userfaultfd and protected: unwritten pages are
    /// known to hold what `table` says.
    watched: bool,
}

struct ProcSnap {
    /// `None` for a snapshot loaded from a store of format 2.
    layout: Option<Vec<Vma>>,
    data: Vec<(Region, Table)>,
    brk: Option<u64>,
    threads: Vec<ThreadState>,
    tids: Vec<i32>,
    /// Descriptors open at the take (`None` where not recorded: a snapshot
    /// loaded from a store of format 3 or older).
    fds: Option<Vec<procfs::Descriptor>>,
    take: TakeStats,
}

/// Snapshots of another process, put back in place (see the module).
pub struct ProcessSnapshots {
    pid: i32,
    start_time: Option<u64>,
    /// The program it ran when opened: a process that `exec`s keeps its
    /// pid and start time, but is another program.
    identity: Option<procfs::ExecIdentity>,
    /// Why nothing can be done inside the process, if so.
    no_inside: Option<String>,
    /// Why writes are not tracked though calls can be made inside (the
    /// filters refuse `userfaultfd` alone), if so.
    untracked: Option<String>,
    wp: Option<UffdWp>,
    store: PageStore,
    snaps: BTreeMap<SnapId, ProcSnap>,
    next_id: SnapId,
    current: Vec<Known>,
    /// The snapshot `current` holds exactly (after its take, or a whole
    /// restore of it): a reset to it writes back only what was written.
    current_is: Option<SnapId>,
    /// The last call was a whole restore: a take now leaves the pages
    /// written since unprotected (see [`ProcessSnapshots::take`]).
    after_restore: bool,
    spare: Vec<Vec<Chunk>>,
    buf: Vec<u8>,
    /// Pages written at every quick reset lately (see `memory::Hot`).
    hot: memory::Hot,
}

impl std::fmt::Debug for ProcessSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessSnapshots")
            .field("pid", &self.pid)
            .field("snapshots", &self.snaps.len())
            .field("no_inside", &self.no_inside)
            .finish_non_exhaustive()
    }
}

fn is_data(v: &Vma) -> bool {
    v.is_private_writable()
        && !matches!(&v.backing, layout::Backing::Other(n) if n.contains("hugepage"))
}

/// The calls a take and a whole restore make inside the process (the
/// break, mappings, alternate stacks, descriptors).
const INSIDE_CALLS: [libc::c_long; 11] = [
    libc::SYS_brk,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_sigaltstack,
    libc::SYS_getpid,
    libc::SYS_close,
    libc::SYS_openat,
    libc::SYS_dup3,
    libc::SYS_lseek,
    libc::SYS_fcntl,
];

/// Whether the process's filters allow every one of [`INSIDE_CALLS`]
/// (stopped for the moment it takes to ask): a restore they would cut
/// short half-way is refused before it starts.
fn inside_calls_allowed(pid: i32) -> std::result::Result<(), MechError> {
    let stopped = Stopped::new(pid)?;
    Remote::new(&stopped)?.check_calls(&INSIDE_CALLS)
}

fn page_index(r: Region, addr: u64) -> usize {
    ((addr - r.start) / PAGE_SIZE as u64) as usize
}

impl ProcessSnapshots {
    /// Opens a handle on process `pid`: tracking from outside starts now.
    /// Where nothing can be done inside the process, the handle opens all
    /// the same for memory-only restores, and [`note`](Self::note) says why.
    pub fn open(pid: i32) -> Result<Self> {
        procfs::check_target(pid)?;
        super::remote::may_register(pid)?;
        let (wp, no_inside, untracked) = match UffdWp::open_in(pid) {
            Ok(wp) => (Some(wp), None, None),
            // Filters that were read and refuse the userfaultfd call: the
            // other calls are each asked of them when made, and only the
            // tracking is left out (every page compared at a restore).
            Err(MechError::Refused(
                r @ pagewise_mech::Refusal::Seccomp {
                    answer: Some(_), ..
                },
            )) if matches!(&r, pagewise_mech::Refusal::Seccomp { call, .. }
                if *call == pagewise_mech::seccomp::call_name(libc::SYS_userfaultfd)) =>
            {
                match inside_calls_allowed(pid) {
                    Ok(()) => (None, None, Some(r.to_string())),
                    Err(e @ (MechError::Refused(_) | MechError::Unsupported { .. })) => {
                        (None, Some(e.to_string()), None)
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            // Another tracer: it cannot even be stopped, so not even
            // memory can be put back while it is traced.
            Err(e @ MechError::Refused(pagewise_mech::Refusal::Traced { .. })) => {
                return Err(e.into())
            }
            Err(e @ (MechError::Refused(_) | MechError::Unsupported { .. })) => {
                (None, Some(e.to_string()), None)
            }
            Err(e) => return Err(e.into()),
        };
        Ok(Self::with(pid, wp, no_inside, untracked))
    }

    /// Opens a handle for one restore of a stored snapshot
    /// ([`load`](Self::load), then [`restore`](Self::restore)), tracking
    /// nothing: the restore compares what memory holds with the snapshot
    /// and writes what differs. Registering every mapping for writes no
    /// later restore will ask about would cost more than that comparison
    /// on a sparse mapping (write protection set at each of its pages:
    /// 40 ms and 20 MiB of the process's page tables for 10 GiB mapped).
    /// Refused and noted as [`open`](Self::open) does.
    pub fn open_for_one_restore(pid: i32) -> Result<Self> {
        procfs::check_target(pid)?;
        super::remote::may_register(pid)?;
        let no_inside = match inside_calls_allowed(pid) {
            Ok(()) => None,
            Err(e @ MechError::Refused(pagewise_mech::Refusal::Traced { .. })) => {
                return Err(e.into())
            }
            Err(e @ (MechError::Refused(_) | MechError::Unsupported { .. })) => Some(e.to_string()),
            Err(e) => return Err(e.into()),
        };
        Ok(Self::with(pid, None, no_inside, None))
    }

    fn with(
        pid: i32,
        wp: Option<UffdWp>,
        no_inside: Option<String>,
        untracked: Option<String>,
    ) -> Self {
        ProcessSnapshots {
            pid,
            start_time: procfs::start_time(pid),
            identity: procfs::exec_identity(pid),
            no_inside,
            untracked,
            wp,
            store: PageStore::new(true),
            snaps: BTreeMap::new(),
            next_id: 1,
            current: Vec::new(),
            current_is: None,
            after_restore: false,
            spare: Vec::new(),
            hot: memory::Hot::default(),
            buf: vec![0u8; BATCH * PAGE_SIZE],
        }
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Why only memory can be put back, if so.
    pub fn note(&self) -> Option<&str> {
        self.no_inside.as_deref()
    }

    /// Why the process's writes are not tracked while everything else can
    /// be put back, if so (its filters refuse `userfaultfd` alone): every
    /// page is then compared at a restore.
    pub fn untracked(&self) -> Option<&str> {
        self.untracked.as_deref()
    }

    /// Stops the process, checking it is still the one the handle opened,
    /// running the same program.
    fn stop(&self) -> Result<Stopped> {
        let s = Stopped::new(self.pid)?;
        self.same_process()?;
        Ok(s)
    }

    /// The stop for one call: none where the caller holds the process
    /// stopped (`held`; checked to be the one opened), else one made here
    /// (the process let go when it is dropped).
    fn stopped_here(&self, held: Option<&Stopped>) -> Result<Option<Stopped>> {
        match held {
            Some(_) => {
                self.same_process()?;
                Ok(None)
            }
            None => Ok(Some(self.stop()?)),
        }
    }

    /// Refuses a process that is not the one opened (its pid reused, or
    /// its program replaced).
    fn same_process(&self) -> Result<()> {
        if procfs::start_time(self.pid) != self.start_time {
            return Err(MechError::ProcessExited(self.pid).into());
        }
        if self.identity.is_some() && procfs::exec_identity(self.pid) != self.identity {
            return Err(MechError::ProgramReplaced(self.pid).into());
        }
        Ok(())
    }

    /// Takes a snapshot of the process's memory, layout and threads.
    ///
    /// Right after a whole restore, the pages read stay unprotected: a
    /// restore that follows (the cycle of a search or a fuzzer) then
    /// writes them without a fault each, and protects them again. They
    /// show as written until then, and the next take or restore reads or
    /// writes them again. A take after a take protects them, so a page is
    /// never left unprotected for longer than one interval.
    pub fn take(&mut self) -> Result<SnapId> {
        let r = self.take_stopped(None);
        self.gone_or(r)
    }

    /// As [`take`](Self::take), the process being held stopped by the
    /// caller (a [`session::ResetSession`]).
    pub(crate) fn take_held(&mut self, held: &Stopped) -> Result<SnapId> {
        let r = self.take_stopped(Some(held));
        self.gone_or(r)
    }

    /// An error met while the process ended is that it ended (a call on
    /// it answering `ESRCH` says so before its state does).
    fn gone_or<T>(&self, r: Result<T>) -> Result<T> {
        match r {
            Err(e)
                if e.class() != pagewise_mech::ErrorClass::Gone
                    && (e.errno() == libc::ESRCH || !procfs::is_alive(self.pid)) =>
            {
                Err(MechError::ProcessExited(self.pid).into())
            }
            r => r,
        }
    }

    fn take_stopped(&mut self, held: Option<&Stopped>) -> Result<SnapId> {
        let t0 = Instant::now();
        let own = self.stopped_here(held)?;
        let Some(stopped) = held.or(own.as_ref()) else {
            return Err(MechError::ProcessExited(self.pid).into());
        };
        let layout = layout::read(Some(self.pid))?;
        let regions: Vec<Region> = layout
            .iter()
            .filter(|v| is_data(v))
            .filter_map(|v| Region::new(v.start, v.end - v.start).ok())
            .collect();
        let (brk, threads) = match &self.no_inside {
            None => {
                let (brk, t) = inside_state(stopped)?;
                (Some(brk), t)
            }
            Some(_) => (None, Vec::new()),
        };
        let mut stats = TakeStats::default();
        let data = self.read_memory(&regions, &mut stats)?;
        self.after_restore = false;
        let tids = stopped.tids().to_vec();
        let fds = Some(procfs::descriptors(self.pid)?);
        drop(own);
        stats.pages = regions.iter().map(Region::pages).sum();
        stats.elapsed_ns = t0.elapsed().as_nanos() as u64;
        let id = self.next_id;
        self.next_id += 1;
        self.current_is = Some(id);
        self.snaps.insert(
            id,
            ProcSnap {
                layout: Some(layout),
                data,
                brk,
                threads,
                tids,
                fds,
                take: stats,
            },
        );
        Ok(id)
    }

    fn snap(&self, id: SnapId) -> Result<&ProcSnap> {
        self.snaps.get(&id).ok_or(Error::NoSnapshot { id })
    }

    /// Puts snapshot `id` back into the process (see the module).
    pub fn restore(&mut self, id: SnapId, opts: RestoreOptions) -> Result<RestoreReport> {
        let r = self.restore_stopped(id, opts, None, &[]);
        self.gone_or(r)
    }

    /// As [`restore`](Self::restore), the process being held stopped by
    /// the caller (`held`, with the others of `group`, restored with it:
    /// [`group::restore_group`]).
    pub(crate) fn restore_held(
        &mut self,
        id: SnapId,
        opts: RestoreOptions,
        held: &Stopped,
        group: &[i32],
    ) -> Result<RestoreReport> {
        let r = self.restore_stopped(id, opts, Some(held), group);
        self.gone_or(r)
    }

    fn restore_stopped(
        &mut self,
        id: SnapId,
        opts: RestoreOptions,
        held: Option<&Stopped>,
        group: &[i32],
    ) -> Result<RestoreReport> {
        let t0 = Instant::now();
        self.snap(id)?;
        if let (Some(why), false) = (&self.no_inside, opts.memory_only) {
            return Err(RollbackRefusal::MemoryOnly {
                pid: self.pid,
                why: why.clone(),
            }
            .into());
        }
        let mut lap = t0;
        let own = self.stopped_here(held)?;
        let Some(stopped) = held.or(own.as_ref()) else {
            return Err(MechError::ProcessExited(self.pid).into());
        };
        let mut report = RestoreReport::default();
        report.phases.stop_us = us_since(&mut lap);
        let pid = self.pid;
        let snap = &self.snaps[&id];
        if snap.layout.is_none() && !opts.memory_only {
            return Err(RollbackRefusal::MemoryOnly {
                pid,
                why: format!(
                    "snapshot {id} holds memory alone, no layout or threads (a store of format 2)"
                ),
            }
            .into());
        }
        if !opts.memory_only {
            let mut now = stopped.tids().to_vec();
            now.sort_unstable();
            let mut then = snap.tids.clone();
            then.sort_unstable();
            if now != then {
                return Err(RollbackRefusal::ThreadsChanged {
                    pid,
                    id,
                    made: now.iter().filter(|t| !then.contains(t)).copied().collect(),
                    ended: then.iter().filter(|t| !now.contains(t)).copied().collect(),
                }
                .into());
            }
            // A thread caught just after it was made, before it registered
            // its rseq area, and registered since, would register it again
            // once its registers are put back: the kernel refuses, and the
            // C library aborts the process. Refused as a thread made since.
            let registered: Vec<i32> = snap
                .threads
                .iter()
                .filter(|t| t.rseq.is_none())
                .filter(|t| matches!(pagewise_sys::process::ptrace_rseq_area(t.tid), Ok(Some(_))))
                .map(|t| t.tid)
                .collect();
            if !registered.is_empty() {
                return Err(RollbackRefusal::ThreadsChanged {
                    pid,
                    id,
                    made: registered,
                    ended: Vec::new(),
                }
                .into());
            }
        }
        let fd_plan = fds::plan(
            pid,
            id,
            snap.fds.as_deref(),
            &procfs::descriptors(pid)?,
            opts,
            self.no_inside.is_none(),
            group,
        )?;
        let remote = match self.no_inside {
            None => Some(Remote::new(stopped)?),
            Some(_) => None,
        };
        // Memory-only: threads keep their registers, so the memory they
        // run on stays theirs: the mapping each stack pointer is in and the
        // one its thread-control block (fs base) is in are left alone.
        let threads = opts.memory_only.then(|| thread_memory::read(stopped));
        let threads = threads.transpose()?;
        let own = threads.as_ref().map(|t| t.areas()).unwrap_or_default();
        let theirs = |r: &Region| own.iter().any(|&(a, b)| a < r.end() && b > r.start);
        // Refused before anything is changed where what the threads keep
        // would not match what is put back.
        if let Some(threads) = &threads {
            let put: Vec<Region> = snap
                .data
                .iter()
                .map(|(r, _)| *r)
                .filter(|r| !theirs(r))
                .collect();
            thread_memory::check(self, id, threads, &put)?;
        }
        // The layout first: the break, then every mapping.
        let (calls, fresh) = put_layout(pid, id, snap, stopped, remote.as_ref(), opts)?;
        report.layout_calls = calls;
        report.phases.layout_us = us_since(&mut lap);
        // Then the threads, whose alternate stacks are set through a page
        // the memory restore below writes anyway.
        let scratch = snap.data.first().map(|(r, _)| r.start);
        if let (Some(remote), false, Some(scratch)) = (&remote, opts.memory_only, scratch) {
            threads::put_back(stopped, remote, &snap.threads, scratch)?;
            report.threads = snap.threads.len() as u64;
        }
        report.fds = fds::apply(remote.as_ref(), pid, fd_plan)?;
        report.fd_changes = report.fds.changes();
        report.thread_areas = snap
            .data
            .iter()
            .filter(|(r, _)| theirs(r))
            .map(|(r, _)| [r.start, r.end()])
            .collect();
        let target: Vec<(Region, Table)> = snap
            .data
            .iter()
            .filter(|(r, _)| !theirs(r))
            .map(|(r, t)| {
                (
                    *r,
                    table::share(&mut self.spare, std::slice::from_ref(t)).remove(0),
                )
            })
            .collect();
        let force = scratch.filter(|_| report.threads > 0);
        report.compared = self.wp.is_none();
        report.phases.threads_us = us_since(&mut lap);
        self.current_is = None;
        self.after_restore = false;
        let walk_ns = self.write_memory(target, &fresh, force, &mut report.stats)?;
        if report.thread_areas.is_empty() {
            self.current_is = Some(id);
        }
        self.after_restore = true;
        (report.phases.walk_us, report.phases.copy_us) = walk_and_copy_us(walk_ns, &mut lap);
        drop(own);
        report.stats.elapsed_ns = t0.elapsed().as_nanos() as u64;
        report.phases.resume_us = us_since(&mut lap);
        Ok(report)
    }

    /// Drops snapshot `id`; pages no other snapshot uses are freed.
    pub fn drop_snapshot(&mut self, id: SnapId) -> Result<()> {
        let s = self.snaps.remove(&id).ok_or(Error::NoSnapshot { id })?;
        if self.current_is == Some(id) {
            self.current_is = None;
        }
        let tables = s.data.into_iter().map(|(_, t)| t).collect();
        table::release(&mut self.store, &mut self.spare, tables);
        Ok(())
    }

    /// The snapshots' ids, oldest first.
    pub fn ids(&self) -> Vec<SnapId> {
        self.snaps.keys().copied().collect()
    }

    /// What taking snapshot `id` cost.
    pub fn take_stats(&self, id: SnapId) -> Result<TakeStats> {
        Ok(self.snap(id)?.take)
    }

    /// The private writable mappings snapshot `id` holds.
    pub fn regions(&self, id: SnapId) -> Result<Vec<Region>> {
        Ok(self.snap(id)?.data.iter().map(|(r, _)| *r).collect())
    }

    /// The recorded state of the threads in snapshot `id`.
    pub fn threads(&self, id: SnapId) -> Result<&[ThreadState]> {
        Ok(&self.snap(id)?.threads)
    }

    /// Reads `buf.len()` bytes at `addr` as snapshot `id` holds them
    /// (inside one mapping).
    pub fn read(&self, id: SnapId, addr: u64, buf: &mut [u8]) -> Result<()> {
        let s = self.snap(id)?;
        let (r, t) =
            s.data
                .iter()
                .find(|(r, _)| r.contains(addr))
                .ok_or(Error::NotSnapshotted {
                    addr,
                    snapshot: Some(id),
                })?;
        addr.checked_add(buf.len() as u64)
            .filter(|&e| e <= r.end())
            .ok_or(Error::PastRegion {
                addr,
                len: buf.len() as u64,
                start: r.start,
                end: r.end(),
            })?;
        let mut done = 0;
        while done < buf.len() {
            let off = (addr - r.start) as usize + done;
            let (page, at) = (off / PAGE_SIZE, off % PAGE_SIZE);
            let n = (PAGE_SIZE - at).min(buf.len() - done);
            buf[done..done + n].copy_from_slice(&self.store.page(t.get(page))[at..at + n]);
            done += n;
        }
        Ok(())
    }

    /// Ranges whose contents differ between snapshots `a` and `b` (a
    /// mapping one has and the other not counts whole).
    pub fn diff(&self, a: SnapId, b: SnapId) -> Result<Vec<PageRange>> {
        let (sa, sb) = (self.snap(a)?, self.snap(b)?);
        let mut out = Vec::new();
        for (r, ta) in &sa.data {
            match sb.data.iter().find(|(q, _)| q == r) {
                Some((_, tb)) => {
                    for i in 0..r.pages() as usize {
                        if ta.get(i) != tb.get(i) {
                            let at = r.start + (i * PAGE_SIZE) as u64;
                            push_coalesced(&mut out, at, at + PAGE_SIZE as u64);
                        }
                    }
                }
                None => push_coalesced(&mut out, r.start, r.end()),
            }
        }
        for (r, _) in &sb.data {
            if !sa.data.iter().any(|(q, _)| q == r) {
                push_coalesced(&mut out, r.start, r.end());
            }
        }
        pagewise_mech::region::normalize(&mut out);
        Ok(out)
    }
}

impl Drop for ProcessSnapshots {
    fn drop(&mut self) {
        if let Some(wp) = &self.wp {
            for k in &self.current {
                if k.watched {
                    let _ = wp.unregister(k.region);
                }
            }
        }
    }
}

/// What a snapshot records besides memory, read inside `stopped`: the
/// program break and every thread's state.
pub(crate) fn inside_state(stopped: &Stopped) -> Result<(u64, Vec<ThreadState>)> {
    let remote = Remote::new(stopped)?;
    let threads = threads::capture(stopped, &remote)?;
    Ok((layout::brk(&remote, 0)?, threads))
}

/// Puts the layout of `snap` back (the process stopped): the break, then
/// every mapping, inside the process; without calls inside it, checks the
/// layout is the snapshot's. The calls made and the ranges mapped afresh.
fn put_layout(
    pid: i32,
    id: SnapId,
    snap: &ProcSnap,
    stopped: &Stopped,
    remote: Option<&Remote<'_>>,
    opts: RestoreOptions,
) -> Result<(u64, Vec<(u64, u64)>)> {
    let Some(want) = &snap.layout else {
        let now = layout::read(Some(pid))?;
        // Memory alone: its mappings must be there, private and writable.
        for (r, _) in &snap.data {
            let mut at = r.start;
            for v in now.iter().filter(|v| v.end > r.start && v.start < r.end()) {
                if v.start > at || !v.is_private_writable() {
                    break;
                }
                at = v.end;
            }
            if at < r.end() {
                return Err(RollbackRefusal::LayoutChanged {
                    pid,
                    id,
                    first: format!(
                        "{:#x}..{:#x} is not mapped private and writable",
                        r.start,
                        r.end()
                    ),
                }
                .into());
            }
        }
        return Ok((0, Vec::new()));
    };
    let Some(remote) = remote else {
        let ops = layout::diff(want, &layout::read(Some(pid))?)?;
        return match ops.first() {
            Some(first) => Err(RollbackRefusal::LayoutChanged {
                pid,
                id,
                first: format!("{first:?}"),
            }
            .into()),
            None => Ok((0, Vec::new())),
        };
    };
    if let Some(b) = snap.brk {
        let got = layout::brk(remote, b)?;
        if got != b {
            return Err(Error::for_pid(
                pid,
                format!("brk({b:#x}) made inside it (the break stayed at {got:#x})"),
                std::io::Error::from_raw_os_error(libc::ENOMEM),
            ));
        }
    }
    let mut ops = layout::diff(want, &layout::read(Some(pid))?)?;
    if opts.memory_only {
        // Threads keep their registers: a stack one of them runs on now
        // stays, whatever the snapshot had there.
        let sps: Vec<u64> = stopped
            .tids()
            .iter()
            .filter_map(|&t| pagewise_sys::process::ptrace_getregs(t).ok())
            .map(|r| r.rsp)
            .collect();
        ops.retain(|o| {
            let (a, b) = o.range();
            !sps.iter().any(|&sp| a <= sp && sp < b)
        });
    }
    layout::check(pid, &ops)?;
    layout::apply(remote, pid, &ops)?;
    let fresh = ops
        .iter()
        .filter(|o| matches!(o, Op::Map { .. }))
        .map(Op::range)
        .collect();
    Ok((ops.len() as u64, fresh))
}
