//! Named far-memory instances shared between processes (DiME's
//! `/proc/dime_config`): one small shared-memory file per instance holds its
//! configuration and one slot of counters per member process.
//!
//! Every process in an instance runs its own engine (in the process, through
//! the preload shim) over its own memory; the instance ties them together:
//! - **one budget:** an engine counts the local pages of every live member
//!   against `local_pages`; when the instance is full it evicts one of its
//!   own pages (local replacement: a process never takes another's page),
//!   and a member well above its share of a full budget (by pages with
//!   data) gives pages back, checked every 50 ms, faulting or idle;
//! - **one configuration:** [`Instance::set`] bumps a generation number that
//!   every engine checks before each fault and while idle, so a change
//!   applies at once;
//! - **one view:** [`Instance::members`] reads every member's counters.
//!
//! The file lives in [`dir`], is created with mode 0600 and belongs to the
//! user who created the instance. A process joins only an instance whose
//! file its own user owns (checked on the open file, never on a field
//! inside it: root does not join an instance another user planted); that
//! user or root may change it. The directory is shared like `/tmp` (sticky,
//! world-writable); one that another user owns and could rewrite is
//! refused. Names `farmem run` makes up are not predictable.
//!
//! # The file, a contract between processes
//!
//! Every member maps the same file, which may have been made by another
//! build of pagewise, so its layout is fixed and checked:
//!
//! - It is one `Header` (`repr(C)`, native byte order, 29,272 bytes; every
//!   struct's size is asserted at compile time): magic `"pagefarm"`, the
//!   layout number, the owner and creator, then atomics only — the settings
//!   and their `generation`, the calibrated floor, the coverage request,
//!   `MAX_MEMBERS` member slots and 16 retired-run entries.
//! - **Version rule:** any change to a field's order, size or meaning in
//!   `Header`, `Slot`, `Retired` or the engine's `Counters` bumps `LAYOUT`
//!   (now 5); a process refuses an instance of another layout with an error
//!   that says so, never reads it.
//! - Writers: the creator writes every other field once, then the magic
//!   number last, after a release fence (a file without it is not yet an
//!   instance); afterwards settings change only through
//!   [`Instance::set`] (then `generation` is bumped, release), slots only
//!   through [`Instance::join`] (a compare-and-swap on the slot's state) and
//!   the member's own engine (its counters).
//! - **Coverage hand-off:** the `coverage` counter is odd while a window is
//!   open (`Instance::request_coverage`); each member's engine, seeing the
//!   counter change, opens or closes its window and, on closing, writes its
//!   [`CoverageReport`](pagewise_mech::access::CoverageReport) as JSON to
//!   `Instance::coverage_path` (`NAME.coverage.PID` beside the instance,
//!   written under a temporary name and renamed), carrying the request's
//!   number so that a reader never takes an older window's report.
//!
//! **Why this module holds unsafe code.** An instance is a file shared
//! between processes, mapped as its `Header` (plain integers and atomics,
//! every bit pattern valid, checked by its magic and layout number): the
//! mapping, its creation before publication and its unmapping.

use super::{Counters, Stats};
use crate::{Error, Result};
use serde::Serialize;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, Ordering};

mod names;
pub use names::exists;
pub(crate) use names::unpredictable_name;
use names::{check_dir, check_name};

/// Processes one instance can hold at once.
pub(crate) const MAX_MEMBERS: usize = 64;

/// The smallest budget a percentage gives, pages: a program that starts
/// with little data (a server before its clients come) is not held to a
/// page or two, where every loop over two pages would fault on each access.
pub(crate) const MIN_PERCENT_BUDGET: u64 = 256;
const MAGIC: u64 = 0x7061_6765_6661_726d; // "pagefarm"
const LAYOUT: u64 = 5;
/// Runs whose exited members' counts an instance keeps apart (entry 0
/// gathers the rest).
const RETIRED: usize = 16;

/// What can be set on an instance.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Settings {
    /// One-way latency, ns.
    pub latency_ns: u64,
    /// Bandwidth, bytes per second (0: unlimited).
    pub bandwidth_bps: u64,
    /// Pages that may be local at once across the members (0: use
    /// `local_percent`).
    pub local_pages: u64,
    /// Local budget as a percentage of the pages the members hold data in,
    /// and at least `MIN_PERCENT_BUDGET` pages (0: use `local_pages`).
    pub local_percent: u64,
}

setters!(Settings {
    latency_ns: u64,
    bandwidth_bps: u64,
    local_pages: u64,
    local_percent: u64,
});

#[repr(C)]
struct Slot {
    pid: AtomicI32,
    /// 0 free, 1 live, 2 exited (counters kept).
    state: AtomicU32,
    /// Who started it (the `farmem run` that launched it), for per-run sums.
    tag: AtomicU32,
    _pad: u32,
    /// Pages with data (local or remote).
    data_pages: AtomicU64,
    counters: Counters,
}

/// The summed counters of a run's members whose slots were reused.
#[repr(C)]
struct Retired {
    /// The run's tag; 0 for entry 0, which gathers runs that found no entry.
    tag: AtomicU32,
    /// 0 free, 1 in use.
    used: AtomicU32,
    counters: Counters,
}

#[repr(C)]
struct Header {
    magic: u64,
    layout: u64,
    owner_uid: u32,
    creator_pid: u32,
    generation: AtomicU64,
    latency_ns: AtomicU64,
    bandwidth_bps: AtomicU64,
    local_pages: AtomicU64,
    local_percent: AtomicU64,
    floor_ns: AtomicU64,
    unseen_ns: AtomicU64,
    /// The same on the inline path.
    inline_floor_ns: AtomicU64,
    inline_unseen_ns: AtomicU64,
    /// Access-coverage windows asked for: odd opens one, even closes it.
    coverage: AtomicU64,
    slots: [Slot; MAX_MEMBERS],
    retired: [Retired; RETIRED],
}

// The layout of the file (see the module's contract): a change here must
// bump LAYOUT.
const _: () = {
    assert!(std::mem::size_of::<Counters>() == 368);
    assert!(std::mem::size_of::<Slot>() == 392);
    assert!(std::mem::size_of::<Retired>() == 376);
    assert!(std::mem::size_of::<Header>() == 31_208);
    assert!(LAYOUT == 5);
};

/// Where instance files live: `/dev/shm/pagewise-farmem` (or under the
/// temporary directory where `/dev/shm` is missing); `PAGEWISE_FARMEM_DIR`
/// overrides it.
pub fn dir() -> PathBuf {
    if let Some(d) = pagewise_mech::shim::farmem_dir() {
        return d;
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.join("pagewise-farmem")
    } else {
        std::env::temp_dir().join("pagewise-farmem")
    }
}

/// The smallest budget a program can run in on the handler-thread path:
/// one instruction may need several pages at once (a `movs` whose source
/// and destination each cross a page boundary needs four); with fewer it
/// faults for ever. The inline path lends such an instruction its pages
/// (see [`super::Stats::lent_faults`]) and runs with a budget of one.
pub const MIN_LOCAL_PAGES_THREAD: u64 = 4;
/// The largest one-way latency accepted: 60 s.
pub(crate) const MAX_LATENCY_NS: u64 = 60_000_000_000;

impl Settings {
    /// Refuses settings no emulation can run with, saying why.
    pub(crate) fn check(&self) -> Result<()> {
        if self.local_pages == 0 && !(1..=100).contains(&self.local_percent) {
            return Err(Error::BadSetting {
                key: "local_percent",
                value: self.local_percent,
                range: "1..=100",
            });
        }
        if self.latency_ns > MAX_LATENCY_NS {
            return Err(Error::BadSetting {
                key: "latency_ns",
                value: self.latency_ns,
                range: "at most 60000000000 (60 s)",
            });
        }
        Ok(())
    }
}

/// What a process may do with an instance it opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Access {
    /// List it and read its counters.
    Read,
    /// Change its settings or open a coverage window: its owner or root.
    Control,
    /// Run as a member: its owner only (a member follows the instance's
    /// settings, which its owner sets).
    Join,
}

/// One instance, mapped.
pub struct Instance {
    name: String,
    path: PathBuf,
    header: *mut Header,
    writable: bool,
}

// SAFETY: the mapping is shared memory accessed only through atomics (and
// fields written once before the file is published); the pointer stays valid
// until drop.
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("name", &self.name)
            .finish()
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: `header` is the mapping made in `map`, of this size, and
        // nothing refers to it once the instance is dropped.
        let _ =
            unsafe { pagewise_sys::mem::munmap(self.header.cast(), std::mem::size_of::<Header>()) };
    }
}

/// One member's view in [`Instance::members`].
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Member {
    /// Its process id.
    pub pid: i32,
    /// The tag it joined with (the `farmem run` that started it).
    pub tag: u32,
    /// Whether it is still running.
    pub live: bool,
    /// Pages holding data (local or remote).
    pub data_pages: u64,
    /// Its counters.
    pub stats: Stats,
}

fn euid() -> u32 {
    pagewise_sys::process::geteuid()
}

impl Instance {
    fn map(name: &str, file: std::fs::File, writable: bool) -> Result<Self> {
        let path = dir().join(name);
        let len = std::mem::size_of::<Header>();
        // The callers checked that the file holds at least `len` bytes.
        let p = pagewise_sys::mem::mmap_shared_file(std::os::fd::AsFd::as_fd(&file), len, writable)
            .map_err(|e| Error::os(format!("mapping {}", path.display()), e))?;
        Ok(Instance {
            name: name.to_string(),
            path,
            header: p.cast(),
            writable,
        })
    }

    fn h(&self) -> &Header {
        // SAFETY: `header` points at a live mapping of a Header.
        unsafe { &*self.header }
    }

    /// Creates instance `name` (which must not exist) with `settings` and
    /// the machine's calibrated fault cost (floor and unseen part, ns) on
    /// the handler-thread path and on the inline path.
    pub fn create(
        name: &str,
        settings: Settings,
        thread: (u64, u64),
        inline: (u64, u64),
    ) -> Result<Self> {
        check_name(name)?;
        settings.check()?;
        let d = dir();
        std::fs::create_dir_all(&d)
            .map_err(|e| Error::os(format!("creating {}", d.display()), e))?;
        // A directory every user may add instances to, like /tmp.
        if std::fs::metadata(&d).is_ok_and(|m| m.uid() == euid()) {
            let _ =
                std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o1777));
        }
        check_dir(&d)?;
        let path = d.join(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(|e| -> Error {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    Error::InstanceExists {
                        name: name.to_string(),
                    }
                } else {
                    Error::os(format!("creating {}", path.display()), e)
                }
            })?;
        file.set_len(std::mem::size_of::<Header>() as u64)
            .map_err(|e| Error::os(format!("sizing {}", path.display()), e))?;
        let inst = Self::map(name, file, true)?;
        // SAFETY: the file is new and all ours; the fields are written
        // before the magic number that makes it valid to others.
        unsafe {
            let h = &mut *inst.header;
            h.layout = LAYOUT;
            h.owner_uid = euid();
            h.creator_pid = std::process::id();
        }
        let h = inst.h();
        h.floor_ns.store(thread.0, Ordering::Relaxed);
        h.unseen_ns.store(thread.1, Ordering::Relaxed);
        h.inline_floor_ns.store(inline.0, Ordering::Relaxed);
        h.inline_unseen_ns.store(inline.1, Ordering::Relaxed);
        inst.store(settings);
        std::sync::atomic::fence(Ordering::Release);
        // SAFETY: as above; last write of creation.
        unsafe { (*inst.header).magic = MAGIC };
        Ok(inst)
    }

    /// Opens instance `name` for `access` (see [`Access`]). Ownership is
    /// checked on the opened file itself.
    pub fn open(name: &str, access: Access) -> Result<Self> {
        check_name(name)?;
        let path = dir().join(name);
        let writable = access != Access::Read;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::NoInstance {
                    name: name.to_string(),
                },
                std::io::ErrorKind::PermissionDenied => Error::NotOwner {
                    name: name.to_string(),
                    owner: None,
                    join: access == Access::Join,
                },
                _ => Error::os(format!("opening {}", path.display()), e),
            })?;
        let meta = file
            .metadata()
            .map_err(|e| Error::os(format!("reading {}", path.display()), e))?;
        if !meta.is_file() || meta.len() < std::mem::size_of::<Header>() as u64 {
            return Err(pagewise_mech::Error::Corrupt {
                path: path.display().to_string(),
                what: "not an instance file".into(),
            }
            .into());
        }
        let allowed = match access {
            Access::Read => true,
            Access::Control => meta.uid() == euid() || euid() == 0,
            Access::Join => meta.uid() == euid(),
        };
        if !allowed {
            return Err(Error::NotOwner {
                name: name.to_string(),
                owner: Some(meta.uid()),
                join: access == Access::Join,
            });
        }
        let inst = Self::map(name, file, writable)?;
        let h = inst.h();
        if h.magic != MAGIC || h.layout != LAYOUT {
            return Err(pagewise_mech::Error::Corrupt {
                path: path.display().to_string(),
                what: format!(
                    "not an instance of this pagewise version (layout {}, this one reads {LAYOUT})",
                    h.layout
                ),
            }
            .into());
        }
        Ok(inst)
    }

    /// Every instance in [`dir`] (unreadable or foreign files are skipped).
    pub fn list() -> Result<Vec<Self>> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(dir()) else {
            return Ok(out);
        };
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        names.sort();
        for n in names {
            if let Ok(i) = Self::open(&n, Access::Read) {
                out.push(i);
            }
        }
        Ok(out)
    }

    /// Left behind: its creator and every member are gone (a `farmem run`
    /// killed before it could remove it).
    pub fn is_stale(&self) -> bool {
        !pagewise_mech::procfs::is_alive(self.h().creator_pid as i32)
            && self.members().iter().all(|m| !m.live)
    }

    /// Removes every stale instance this user may remove; returns how many.
    pub fn sweep() -> usize {
        let mut n = 0;
        for i in Self::list().unwrap_or_default() {
            if i.is_stale() && (euid() == 0 || euid() == i.owner_uid()) && i.remove().is_ok() {
                n += 1;
            }
        }
        n
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The uid that owns it.
    pub(crate) fn owner_uid(&self) -> u32 {
        self.h().owner_uid
    }

    /// Hands the instance to user `uid` (its file and the owner its
    /// header says), whose processes alone may then join it: for programs
    /// that run as that user in containers, served by root
    /// ([`crate::serve`]). Root only, before any member joins.
    pub fn hand_to(&self, uid: u32) -> Result<()> {
        std::os::unix::fs::chown(&self.path, Some(uid), None)
            .map_err(|e| Error::os(format!("chown of {}", self.path.display()), e))?;
        // SAFETY: the header is mapped for the life of `self`; the field is
        // an aligned u32, stored atomically for any reader.
        unsafe { AtomicU32::from_ptr(&raw mut (*self.header).owner_uid) }
            .store(uid, Ordering::Release);
        Ok(())
    }

    /// The calibration of the path whose counts `c` are (a member that
    /// served a fault inline ran on the inline path).
    fn calibration_of(&self, c: &Counters) -> (u64, u64) {
        self.calibration(if c.served_inline() {
            super::FaultPath::Inline
        } else {
            super::FaultPath::Thread
        })
    }

    /// The calibrated floor and unseen part of a fault on `path`, ns.
    pub fn calibration(&self, path: super::FaultPath) -> (u64, u64) {
        let h = self.h();
        let (f, u) = match path {
            super::FaultPath::Thread => (&h.floor_ns, &h.unseen_ns),
            super::FaultPath::Inline => (&h.inline_floor_ns, &h.inline_unseen_ns),
        };
        (f.load(Ordering::Relaxed), u.load(Ordering::Relaxed))
    }

    /// The settings now.
    pub fn settings(&self) -> Settings {
        let h = self.h();
        Settings {
            latency_ns: h.latency_ns.load(Ordering::Acquire),
            bandwidth_bps: h.bandwidth_bps.load(Ordering::Acquire),
            local_pages: h.local_pages.load(Ordering::Acquire),
            local_percent: h.local_percent.load(Ordering::Acquire),
        }
    }

    /// The configuration generation: it changes with every [`Instance::set`].
    pub(crate) fn generation(&self) -> u64 {
        self.h().generation.load(Ordering::Acquire)
    }

    fn store(&self, s: Settings) {
        let h = self.h();
        h.latency_ns.store(s.latency_ns, Ordering::Release);
        h.bandwidth_bps.store(s.bandwidth_bps, Ordering::Release);
        h.local_pages.store(s.local_pages, Ordering::Release);
        h.local_percent.store(s.local_percent, Ordering::Release);
        h.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// Opens (`open`) or closes an access-coverage window in every member
    /// (see [`Instance::coverage_path`]); returns the request's number, which the
    /// members' reports carry.
    pub(crate) fn request_coverage(&self, open: bool) -> Result<u64> {
        if !self.writable {
            return Err(Error::ReadOnly {
                name: self.name.clone(),
            });
        }
        let h = self.h();
        let now = h.coverage.load(Ordering::Acquire);
        let next = if (now % 2 == 1) == open {
            now + 2
        } else {
            now + 1
        };
        h.coverage.store(next, Ordering::Release);
        h.generation.fetch_add(1, Ordering::AcqRel);
        Ok(next)
    }

    /// The access-coverage request now (see [`Instance::request_coverage`]).
    pub(crate) fn coverage_request(&self) -> u64 {
        self.h().coverage.load(Ordering::Acquire)
    }

    /// Where member `pid` writes its report when a coverage window closes.
    pub(crate) fn coverage_path(&self, pid: i32) -> PathBuf {
        dir().join(format!("{}.coverage.{pid}", self.name))
    }

    /// Changes settings from `key=value` pairs (`latency_ns`,
    /// `bandwidth_bps`, `local_npages` or `local_pages`, `local_percent`).
    /// Every member applies them before its next fault.
    pub fn set(&self, pairs: &[(String, u64)]) -> Result<Settings> {
        if !self.writable {
            return Err(Error::ReadOnly {
                name: self.name.clone(),
            });
        }
        let mut s = self.settings();
        for (k, v) in pairs {
            match k.as_str() {
                "latency_ns" | "latency" => s.latency_ns = *v,
                "bandwidth_bps" | "bandwidth" => s.bandwidth_bps = *v,
                "local_npages" | "local_pages" => {
                    s.local_pages = *v;
                    s.local_percent = 0;
                }
                "local_percent" => {
                    s.local_percent = *v;
                    s.local_pages = 0;
                }
                _ => return Err(Error::UnknownKey { key: k.clone() }),
            }
        }
        s.check()?;
        self.store(s);
        Ok(s)
    }

    /// Takes a member slot for process `pid`, tagged with `tag`.
    pub fn join(&self, pid: i32, tag: u32) -> Result<usize> {
        self.take_slot(pid, tag, true)
    }

    /// [`join`](Self::join) for a process in another pid namespace (a
    /// container) that joins by its host pid, which it cannot see: the
    /// slots of members that died without leaving are not taken (their
    /// pids cannot be judged from there); the server of the instance
    /// (`farmem::serve`) leaves them.
    pub(crate) fn join_from_container(&self, host_pid: i32, tag: u32) -> Result<usize> {
        self.take_slot(host_pid, tag, false)
    }

    fn take_slot(&self, pid: i32, tag: u32, judge_pids: bool) -> Result<usize> {
        if !self.writable {
            return Err(Error::ReadOnly {
                name: self.name.clone(),
            });
        }
        let h = self.h();
        for (i, s) in h.slots.iter().enumerate() {
            let st = s.state.load(Ordering::Acquire);
            // Free; left (its counts are kept in `retired`); or held by a
            // process that died without leaving.
            let reusable = st == 0
                || st == 2
                || (st == 1
                    && judge_pids
                    && !pagewise_mech::procfs::is_alive(s.pid.load(Ordering::Relaxed)));
            if reusable
                && s.state
                    .compare_exchange(st, 3, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                if st != 0 {
                    self.retire(s.tag.load(Ordering::Relaxed), &s.counters);
                }
                s.pid.store(pid, Ordering::Relaxed);
                s.tag.store(tag, Ordering::Relaxed);
                s.data_pages.store(0, Ordering::Relaxed);
                s.counters.clear();
                s.state.store(1, Ordering::Release);
                return Ok(i);
            }
        }
        Err(Error::TooManyMembers {
            name: self.name.clone(),
            max: MAX_MEMBERS,
        })
    }

    /// Keeps the counts of a member whose slot is reused, with its run's.
    fn retire(&self, tag: u32, c: &Counters) {
        let r = &self.h().retired;
        let entry = r[1..]
            .iter()
            .find(|e| e.used.load(Ordering::Acquire) == 1 && e.tag.load(Ordering::Relaxed) == tag)
            .or_else(|| {
                r[1..].iter().find(|e| {
                    e.used.load(Ordering::Acquire) == 0
                        && e.used
                            .compare_exchange(0, 2, Ordering::AcqRel, Ordering::Relaxed)
                            .is_ok()
                        && {
                            e.counters.clear();
                            e.tag.store(tag, Ordering::Relaxed);
                            e.used.store(1, Ordering::Release);
                            true
                        }
                })
            })
            .unwrap_or(&r[0]);
        entry.counters.add_from(c);
    }

    /// The counts of run `tag`'s members whose slots were reused (`None`:
    /// of every run).
    pub fn retired(&self, tag: Option<u32>) -> Stats {
        let all: Vec<Stats> = self
            .h()
            .retired
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                let used = *i == 0 || e.used.load(Ordering::Acquire) == 1;
                used && tag.is_none_or(|t| *i != 0 && e.tag.load(Ordering::Relaxed) == t)
            })
            .map(|(_, e)| e.counters.snapshot(self.calibration_of(&e.counters)))
            .collect();
        Stats::sum(&all)
    }

    /// Frees run `tag`'s entry of retired counts (the run reported them).
    pub(crate) fn release_retired(&self, tag: u32) {
        for e in &self.h().retired[1..] {
            if e.used.load(Ordering::Acquire) == 1 && e.tag.load(Ordering::Relaxed) == tag {
                e.used.store(0, Ordering::Release);
            }
        }
    }

    /// Publishes slot `i`'s counters and data pages.
    pub(crate) fn publish(&self, i: usize, c: &Counters, data_pages: u64) {
        let s = &self.h().slots[i];
        s.counters.copy_from(c);
        s.data_pages.store(data_pages, Ordering::Relaxed);
    }

    /// What slot `i` published last: (local pages, pages with data).
    pub(crate) fn published(&self, i: usize) -> (u64, u64) {
        let s = &self.h().slots[i];
        (
            s.counters.local.load(Ordering::Relaxed),
            s.data_pages.load(Ordering::Relaxed),
        )
    }

    /// Marks slot `i` as exited: its counters stay, its pages no longer
    /// count against the budget.
    pub(crate) fn leave(&self, i: usize) {
        let s = &self.h().slots[i];
        s.counters.local.store(0, Ordering::Relaxed);
        s.state.store(2, Ordering::Release);
    }

    /// Leaves every slot of process `pid` (for a supervisor whose child died
    /// without leaving).
    pub(crate) fn leave_pid(&self, pid: i32) {
        for (i, s) in self.h().slots.iter().enumerate() {
            if s.state.load(Ordering::Acquire) == 1 && s.pid.load(Ordering::Relaxed) == pid {
                self.leave(i);
            }
        }
    }

    /// Local pages and pages with data of the live members: what the
    /// budget is checked against.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let mut local = 0;
        let mut data = 0;
        for s in &self.h().slots {
            if s.state.load(Ordering::Acquire) == 1 {
                local += s.counters.local.load(Ordering::Relaxed);
                data += s.data_pages.load(Ordering::Relaxed);
            }
        }
        (local, data)
    }

    /// The budget in pages now: `local_pages`, or `local_percent` of the
    /// members' pages with data (at least 1).
    pub(crate) fn budget(&self, s: &Settings, data_pages: u64) -> u64 {
        if s.local_pages > 0 {
            s.local_pages
        } else {
            (data_pages * s.local_percent)
                .div_ceil(100)
                .max(MIN_PERCENT_BUDGET)
        }
    }

    /// Every member that ever joined (and whose slot was not reused).
    pub fn members(&self) -> Vec<Member> {
        let mut out = Vec::new();
        for s in &self.h().slots {
            let st = s.state.load(Ordering::Acquire);
            if st != 1 && st != 2 {
                continue;
            }
            let pid = s.pid.load(Ordering::Relaxed);
            out.push(Member {
                pid,
                tag: s.tag.load(Ordering::Relaxed),
                live: st == 1 && pagewise_mech::procfs::is_alive(pid),
                data_pages: s.data_pages.load(Ordering::Relaxed),
                stats: s.counters.snapshot(self.calibration_of(&s.counters)),
            });
        }
        out
    }

    /// Removes the instance file (members already running keep their
    /// mapping).
    pub(crate) fn remove(&self) -> Result<()> {
        std::fs::remove_file(&self.path)
            .map_err(|e| Error::os(format!("removing {}", self.path.display()), e))
    }
}
