//! Dirty-page tracking (LDT): which pages were written since a consumer last asked.
//!
//! A [`DirtyTracker`] watches page-aligned regions of the calling process (or
//! the anonymous memory of another process) with one [`BackendKind`]:
//!
//! | backend | how | cost to the program | where |
//! |---|---|---|---|
//! | `uffd-wp` | asynchronous userfaultfd write-protect; `PAGEMAP_SCAN` reads and re-protects written pages atomically | one minor fault per page per interval, resolved in the kernel | own process, or a command started through the preload shim |
//! | `soft-dirty` | `clear_refs` + pagemap bit 55 | one minor fault per page per interval | any process (kernels with `CONFIG_MEM_SOFT_DIRTY`) |
//! | `mprotect` | read-only protection + a `SIGSEGV` handler that records the page and lifts the protection | a signal and two system calls per page per interval | own process |
//! | `hash` | per-page fingerprints compared at each collection | none (the collector reads memory on another core) | own process, or any process through `process_vm_readv` |
//!
//! A collection returns sorted, coalesced [`PageRange`]s and [`CollectStats`].
//!
//! # Guarantees
//! - **Never lose a write.** Every page written after a consumer's previous
//!   collection is in that consumer's next collection. Over-reporting is
//!   allowed (a huge page written once may be reported whole, a page that was
//!   zapped by `MADV_DONTNEED` is reported).
//! - **Several consumers** ([`DirtyTracker::add_consumer`]) each see every
//!   write since *their own* last collection: one consumer's collection
//!   re-arms the backend, and what it found is kept for every other consumer
//!   until that consumer collects. This is LDT's coordination problem, solved
//!   above the kernel instead of with spare page-table bits.
//! - Other threads may write while a collection runs; a write that races the
//!   collection is reported in this collection or the next one.

mod hash;
mod launch;
mod mprotect;
#[doc(hidden)]
pub mod protocol;
mod soft_dirty;
mod uffd_wp;

use pagewise_mech::probe;
use pagewise_mech::region::{self, PageRange, Region};
mod error;
pub use error::{Error, Result};
use pagewise_mech::Error as MechError;
use serde::Serialize;
use std::time::Instant;

pub use hash::HashBackend;
pub use launch::{start_tracked, TrackRequest, Tracked};

/// The tracking mechanisms.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
///
/// The discriminants are the wire values, in the track protocol and as the C
/// API's `PW_BACKEND_*` constants: fixed, never renumbered.
#[repr(u32)]
#[non_exhaustive]
pub enum BackendKind {
    /// Asynchronous userfaultfd write-protect with `PAGEMAP_SCAN`.
    UffdWp = 1,
    /// Soft-dirty bits (`clear_refs` and pagemap bit 55).
    SoftDirty = 2,
    /// `mprotect` + `SIGSEGV` write faults.
    Mprotect = 3,
    /// Content fingerprints, no faults.
    Hash = 4,
    /// The best available here.
    Auto = 0,
}

impl BackendKind {
    /// The wire value (the discriminant).
    pub(crate) fn wire(self) -> u32 {
        self as u32
    }

    /// The backend of a wire value, `None` for an unknown one.
    pub(crate) fn from_wire(v: u32) -> Option<Self> {
        [
            BackendKind::Auto,
            BackendKind::UffdWp,
            BackendKind::SoftDirty,
            BackendKind::Mprotect,
            BackendKind::Hash,
        ]
        .into_iter()
        .find(|b| b.wire() == v)
    }

    /// Every concrete backend, best first.
    pub const ALL: [BackendKind; 4] = [
        BackendKind::UffdWp,
        BackendKind::SoftDirty,
        BackendKind::Mprotect,
        BackendKind::Hash,
    ];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::UffdWp => "uffd-wp",
            BackendKind::SoftDirty => "soft-dirty",
            BackendKind::Mprotect => "mprotect",
            BackendKind::Hash => "hash",
            BackendKind::Auto => "auto",
        }
    }

    /// Whether this backend can track the calling process here; `Err` says why not.
    pub fn available_in_process(self) -> std::result::Result<(), String> {
        let p = probe::get();
        match self {
            BackendKind::UffdWp => {
                if p.uffd_access.is_none() {
                    Err(format!("userfaultfd unavailable: {}", p.why("userfaultfd")))
                } else if !p.uffd_has(pagewise_sys::uffd::feature::WP_ASYNC) {
                    Err(format!(
                        "UFFD_FEATURE_WP_ASYNC missing: {}",
                        p.why("uffd.WP_ASYNC")
                    ))
                } else if !p.uffd_has(pagewise_sys::uffd::feature::WP_UNPOPULATED) {
                    Err(format!(
                        "UFFD_FEATURE_WP_UNPOPULATED missing: {}",
                        p.why("uffd.WP_UNPOPULATED")
                    ))
                } else if !p.pagemap_scan {
                    Err(format!("PAGEMAP_SCAN missing: {}", p.why("pagemap_scan")))
                } else {
                    Ok(())
                }
            }
            BackendKind::SoftDirty => {
                if p.soft_dirty {
                    Ok(())
                } else {
                    Err(p.why("soft_dirty"))
                }
            }
            BackendKind::Mprotect | BackendKind::Hash => Ok(()),
            BackendKind::Auto => Ok(()),
        }
    }

    /// Whether this backend can watch another process from outside; `Err` says why not.
    pub fn available_for_pid(self) -> std::result::Result<(), String> {
        match self {
            BackendKind::UffdWp => {
                self.available_in_process()?;
                if !cfg!(target_arch = "x86_64") {
                    return Err("uffd-wp from outside makes a system call inside the target, implemented for x86-64 only; start the command under `pagewise track -- CMD` instead".into());
                }
                let scope = pagewise_mech::procfs::read_trimmed("/proc/sys/kernel/yama/ptrace_scope")
                    .unwrap_or_default();
                if scope == "3" {
                    return Err("ptrace is disabled (kernel.yama.ptrace_scope = 3)".into());
                }
                Ok(())
            }
            BackendKind::Mprotect => Err("mprotect needs a signal handler inside the target; it tracks only the calling process".into()),
            BackendKind::SoftDirty | BackendKind::Hash | BackendKind::Auto => self.available_in_process(),
        }
    }

    /// Resolves `Auto` to the best backend available in this process.
    pub fn resolve_in_process(self) -> BackendKind {
        match self {
            BackendKind::Auto => {
                if BackendKind::UffdWp.available_in_process().is_ok() {
                    BackendKind::UffdWp
                } else if BackendKind::SoftDirty.available_in_process().is_ok() {
                    BackendKind::SoftDirty
                } else {
                    BackendKind::Mprotect
                }
            }
            k => k,
        }
    }

    /// Resolves `Auto` to the best backend for watching another process.
    pub(crate) fn resolve_for_pid(self) -> BackendKind {
        match self {
            BackendKind::Auto => {
                if BackendKind::UffdWp.available_for_pid().is_ok() {
                    BackendKind::UffdWp
                } else {
                    BackendKind::without_the_target()
                }
            }
            k => k,
        }
    }

    /// The best backend that needs nothing inside the target process.
    fn without_the_target() -> BackendKind {
        if BackendKind::SoftDirty.available_in_process().is_ok() {
            BackendKind::SoftDirty
        } else {
            BackendKind::Hash
        }
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "uffd-wp" | "uffd" => Ok(BackendKind::UffdWp),
            "soft-dirty" => Ok(BackendKind::SoftDirty),
            "mprotect" => Ok(BackendKind::Mprotect),
            "hash" => Ok(BackendKind::Hash),
            "auto" => Ok(BackendKind::Auto),
            _ => Err(format!(
                "unknown backend {s:?}: expected uffd-wp, soft-dirty, mprotect, hash or auto"
            )),
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What one collection cost and found.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct CollectStats {
    /// Pages the backend looked at (the tracked pages).
    pub pages_scanned: u64,
    /// Pages reported dirty to this consumer.
    pub pages_dirty: u64,
    /// Number of coalesced ranges reported.
    pub ranges: u64,
    /// Wall time of the collection, in nanoseconds.
    pub elapsed_ns: u64,
    /// Write faults the backend handled since the previous scan (`mprotect` only).
    pub faults: u64,
    /// Pages read to compute fingerprints (`hash` only).
    pub pages_hashed: u64,
}

/// One consumer's collection: the dirty ranges and what it cost.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Collection {
    /// Sorted, coalesced dirty ranges.
    pub ranges: Vec<PageRange>,
    /// Statistics.
    pub stats: CollectStats,
}

impl Collection {
    /// A collection of `ranges` over `regions`, its statistics completed.
    fn finish(
        ranges: Vec<PageRange>,
        mut stats: CollectStats,
        regions: &[Region],
        t0: Instant,
    ) -> Self {
        stats.pages_scanned = regions.iter().map(Region::pages).sum();
        stats.pages_dirty = region::total_pages(&ranges);
        stats.ranges = ranges.len() as u64;
        stats.elapsed_ns = t0.elapsed().as_nanos() as u64;
        Collection { ranges, stats }
    }
}

/// A handle naming one consumer of a tracker's dirty information.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerId(usize);

/// What a backend does. `scan` is get-and-clear: it returns pages written since
/// the previous scan and re-arms tracking for them, such that a write racing the
/// scan is reported by this scan or the next one.
pub(crate) trait Backend: Send {
    fn kind(&self) -> BackendKind;
    /// Appends sorted, coalesced dirty ranges to `out`.
    fn scan(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<()>;
    /// Appends the pages written since the previous scan *without* re-arming
    /// them: the next scan reports them again. `false` if the backend cannot
    /// (then nothing was appended).
    fn peek(&mut self, _out: &mut Vec<PageRange>, _stats: &mut CollectStats) -> Result<bool> {
        Ok(false)
    }
    /// Starts tracking `region`. With `baseline`, only writes from now on count;
    /// without, every page already in it is reported at the next scan.
    fn add_region(&mut self, region: Region, baseline: bool) -> Result<()>;
    /// Stops tracking `region` (which was added before).
    fn remove_region(&mut self, region: Region) -> Result<()>;
    /// Tracked regions, sorted.
    fn regions(&self) -> Vec<Region>;
    /// What the backend does differently from its kind's usual way, said
    /// once (a region tracked by another means), if anything.
    fn note(&self) -> Option<&str> {
        None
    }
}

/// Which process a tracker watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Target {
    /// The calling process.
    SelfProcess,
    /// Another process, by pid.
    Pid(i32),
}

impl Target {
    /// The pid of another process; `None` for the calling process.
    pub fn pid(self) -> Option<i32> {
        match self {
            Target::SelfProcess => None,
            Target::Pid(p) => Some(p),
        }
    }
}

/// Tracks writes to regions of memory for one or more consumers.
pub struct DirtyTracker {
    backend: Box<dyn Backend>,
    /// Pending dirty ranges per consumer; `None` for a removed consumer.
    pending: Vec<Option<Vec<PageRange>>>,
    /// Whole-process tracking: mappings come and go under our feet.
    lenient: bool,
    /// Why `Auto` fell back from its first choice (see [`DirtyTracker::note`]).
    note: Option<String>,
    /// Mappings of the process it cannot track, with why, not yet taken
    /// by [`DirtyTracker::take_untracked`]; and every one ever found.
    untracked: Vec<(Region, String)>,
    said: Vec<Region>,
}

impl std::fmt::Debug for DirtyTracker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirtyTracker")
            .field("backend", &self.backend.kind())
            .field("regions", &self.backend.regions())
            .field(
                "consumers",
                &self.pending.iter().filter(|p| p.is_some()).count(),
            )
            .finish()
    }
}

/// Builds a backend over the calling process for a resolved `kind`, after
/// checking that the kernel offers it. `strict`: a `uffd-wp` region that is no
/// longer registered is an error (explicit regions) rather than skipped
/// (whole-process tracking, where mappings come and go).
fn in_process_backend(kind: BackendKind, strict: bool) -> Result<Box<dyn Backend>> {
    kind.available_in_process()
        .map_err(|why| MechError::Unsupported {
            feature: kind.name(),
            why,
        })?;
    Ok(match kind {
        BackendKind::UffdWp if strict => Box::new(uffd_wp::UffdWpBackend::new()?),
        BackendKind::UffdWp => Box::new(uffd_wp::UffdWpBackend::new_lenient()?),
        BackendKind::SoftDirty => Box::new(soft_dirty::SoftDirtyBackend::new(Target::SelfProcess)?),
        BackendKind::Mprotect => Box::new(mprotect::MprotectBackend::new()),
        BackendKind::Hash => Box::new(hash::HashBackend::new(Target::SelfProcess)?),
        BackendKind::Auto => unreachable!("callers resolve Auto first"),
    })
}

impl DirtyTracker {
    /// Tracks `regions` of the calling process with `kind` (`Auto` picks the best
    /// available). Writes from now on are reported. The regions must be mapped,
    /// page-aligned and must not overlap. The default consumer is [`DirtyTracker::DEFAULT`].
    pub fn new(regions: &[Region], kind: BackendKind) -> Result<Self> {
        let mut backend = in_process_backend(kind.resolve_in_process(), true)?;
        let sorted = pagewise_mech::region::sorted_disjoint(regions)?;
        for r in sorted {
            backend.add_region(r, true)?;
        }
        Ok(DirtyTracker {
            backend,
            pending: vec![Some(Vec::new())],
            lenient: false,
            note: None,
            untracked: Vec::new(),
            said: Vec::new(),
        })
    }

    /// Tracks the writable anonymous memory of process `pid` from outside, with
    /// `hash` or `soft-dirty` (`Auto` picks). Mappings that appear later are
    /// picked up at each collection (their pages reported once as dirty).
    pub fn for_process(pid: i32, kind: BackendKind) -> Result<Self> {
        let auto = kind == BackendKind::Auto;
        let resolved = kind.resolve_for_pid();
        if auto && resolved == BackendKind::UffdWp && pagewise_mech::procfs::owns_userfaultfd(pid) {
            // Registering its memory first would make the program's own
            // registrations of it fail.
            let fallback = BackendKind::without_the_target();
            let mut t = Self::for_process_with(pid, fallback)?;
            t.note = Some(format!(
                "process {pid} holds a userfaultfd of its own: uffd-wp would register its memory \
                 first, and a mapping it registered afterwards would be refused to it (EBUSY); \
                 using {fallback}"
            ));
            return Ok(t);
        }
        match Self::for_process_with(pid, resolved) {
            // `Auto` falls back from uffd-wp to what needs nothing inside the
            // target, and says why.
            Err(e)
                if auto
                    && matches!(
                        e,
                        Error::Mech(
                            MechError::Unsupported { .. }
                                | MechError::PermissionDenied { .. }
                                | MechError::Refused(_)
                        ) | Error::HeldElsewhere { .. }
                    ) =>
            {
                let fallback = BackendKind::without_the_target();
                let mut t = Self::for_process_with(pid, fallback)?;
                t.note = Some(format!(
                    "uffd-wp from outside is not possible here ({e}); using {fallback}"
                ));
                Ok(t)
            }
            r => r,
        }
    }

    /// Why the backend is not the best one `Auto` could have picked, or
    /// what it does differently for part of the memory (a mapping another
    /// userfaultfd holds, hashed instead), if so.
    pub fn note(&self) -> Option<&str> {
        self.note.as_deref().or_else(|| self.backend.note())
    }

    /// As [`DirtyTracker::for_process`] with `uffd-wp`, the holes of the
    /// process's memory (pages it does not hold) neither protected nor
    /// scanned: arming and every collection cost what memory holds, not
    /// the size of the mappings (see
    /// [`pagewise_mech::wp::UffdWp::open_in_sparse`]). A page written in a
    /// hole is reported as written; a page the process gives back
    /// (`MADV_DONTNEED`), which now reads as zeros, is **not**: the caller
    /// must walk what memory holds (a snapshot does, to skip the holes).
    pub fn for_process_sparse(pid: i32) -> Result<Self> {
        Self::for_process_built(pid, BackendKind::UffdWp, true)
    }

    fn for_process_with(pid: i32, kind: BackendKind) -> Result<Self> {
        Self::for_process_built(pid, kind, false)
    }

    fn for_process_built(pid: i32, kind: BackendKind, sparse: bool) -> Result<Self> {
        kind.available_for_pid()
            .map_err(|why| MechError::Unsupported {
                feature: kind.name(),
                why,
            })?;
        pagewise_mech::procfs::check_target(pid)?;
        pagewise_sys::process::process_exists(pid).map_err(|e| match e.raw_os_error() {
            Some(libc::ESRCH) => MechError::NoSuchProcess(pid).into(),
            _ => Error::for_pid(pid, "signalling the process", e),
        })?;
        let backend: Box<dyn Backend> = match kind {
            BackendKind::SoftDirty => {
                Box::new(soft_dirty::SoftDirtyBackend::new(Target::Pid(pid))?)
            }
            BackendKind::Hash => Box::new(hash::HashBackend::new(Target::Pid(pid))?),
            BackendKind::UffdWp => Box::new(uffd_wp::UffdWpBackend::for_process(pid, sparse)?),
            _ => unreachable!("checked by available_for_pid"),
        };
        let mut t = DirtyTracker {
            backend,
            pending: vec![Some(Vec::new())],
            lenient: true,
            note: None,
            untracked: Vec::new(),
            said: Vec::new(),
        };
        t.sync_process_mappings(Some(pid), true)?;
        Ok(t)
    }

    /// Tracks the writable anonymous memory of the calling process (heap,
    /// anonymous mappings, stacks), as the preload shim does inside a program.
    /// Call [`DirtyTracker::sync_process_mappings`] with `None` before each
    /// collection to follow new and vanished mappings.
    pub fn for_self_anonymous(kind: BackendKind) -> Result<Self> {
        let kind = kind.resolve_in_process();
        if kind == BackendKind::Mprotect {
            return Err(MechError::Unsupported {
                feature: "mprotect",
                why: "the mprotect backend cannot watch a whole process (it would fault on memory the program protects itself)".into(),
            }
            .into());
        }
        let backend = in_process_backend(kind, false)?;
        let mut t = DirtyTracker {
            backend,
            pending: vec![Some(Vec::new())],
            lenient: true,
            note: None,
            untracked: Vec::new(),
            said: Vec::new(),
        };
        t.sync_process_mappings(None, true)?;
        Ok(t)
    }

    /// Re-reads the writable anonymous mappings of process `pid` (`None`: the
    /// calling process): new ones are added (reported dirty once unless
    /// `baseline`), vanished ones removed.
    pub fn sync_process_mappings(&mut self, pid: Option<i32>, baseline: bool) -> Result<()> {
        if let Some(p) = pid {
            if !pagewise_mech::procfs::is_alive(p) {
                return Err(MechError::ProcessExited(p).into());
            }
        }
        let wanted: Vec<Region> = pagewise_mech::procfs::writable_anonymous(pid)?
            .iter()
            .filter_map(|m| Region::new(m.start, m.len()).ok())
            .collect();
        self.sync_regions(&wanted, baseline)?;
        // Mappings userfaultfd cannot register (a droppable one: `dp` in
        // its VmFlags) are left alone, and said once.
        let have = self.backend.regions();
        let missing: Vec<Region> = wanted
            .iter()
            .filter(|r| !have.contains(r) && !self.said.contains(r))
            .copied()
            .collect();
        if !missing.is_empty() {
            let dp = pagewise_mech::procfs::with_vm_flag(pid, &["dp"]).unwrap_or_default();
            for r in missing {
                if dp.contains(&(r.start, r.end())) {
                    self.said.push(r);
                    self.untracked.push((
                        r,
                        "a droppable mapping (MAP_DROPPABLE), which userfaultfd cannot register"
                            .into(),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Mappings found since the last call that cannot be tracked, with
    /// why (each said once).
    pub fn take_untracked(&mut self) -> Vec<(Region, String)> {
        std::mem::take(&mut self.untracked)
    }

    /// Makes the tracked regions equal `wanted` (sorted, non-overlapping). For a
    /// live process a mapping may vanish between reading its maps and adding
    /// it; such a mapping is skipped.
    pub(crate) fn sync_regions(&mut self, wanted: &[Region], baseline: bool) -> Result<()> {
        let have = self.backend.regions();
        for r in have.iter().filter(|r| !wanted.contains(r)) {
            self.backend.remove_region(*r)?;
        }
        for r in wanted.iter().filter(|r| !have.contains(r)) {
            match self.backend.add_region(*r, baseline) {
                Ok(()) => {}
                Err(_) if self.lenient => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The consumer every tracker starts with.
    pub const DEFAULT: ConsumerId = ConsumerId(0);

    /// The backend in use.
    pub fn backend(&self) -> BackendKind {
        self.backend.kind()
    }

    /// The tracked regions, sorted.
    pub fn regions(&self) -> Vec<Region> {
        self.backend.regions()
    }

    /// Adds a consumer. It sees every write from now on (and possibly some
    /// earlier ones: over-reporting is allowed).
    pub fn add_consumer(&mut self) -> ConsumerId {
        self.pending.push(Some(Vec::new()));
        ConsumerId(self.pending.len() - 1)
    }

    /// Removes a consumer; its pending information is dropped.
    pub fn remove_consumer(&mut self, id: ConsumerId) {
        if let Some(p) = self.pending.get_mut(id.0) {
            *p = None;
        }
    }

    /// Collects for the default consumer.
    pub fn collect(&mut self) -> Result<Collection> {
        self.collect_for(Self::DEFAULT)
    }

    /// Every page written since the default consumer's previous collection,
    /// without starting a new interval: its next collection reports them
    /// again (and whatever is written meanwhile). Cheaper than a collection
    /// where the backend can leave pages unprotected (`uffd-wp`: a scan that
    /// does not re-protect, so later writes to these pages do not fault).
    /// `None` where the backend cannot; use [`DirtyTracker::collect`] then.
    pub fn peek(&mut self) -> Result<Option<Collection>> {
        let id = Self::DEFAULT;
        if !matches!(self.pending.get(id.0), Some(Some(_))) {
            return Err(Error::NoConsumer { id: id.0 });
        }
        let t0 = Instant::now();
        let mut stats = CollectStats::default();
        let mut fresh = Vec::new();
        if !self.backend.peek(&mut fresh, &mut stats)? {
            return Ok(None);
        }
        let regions = self.backend.regions();
        let pending = self.pending[id.0].as_deref().unwrap_or_default();
        let ranges = region::clip_to(&region::union_sorted(pending, &fresh), &regions);
        Ok(Some(Collection::finish(ranges, stats, &regions, t0)))
    }

    /// Returns every page written since `id`'s previous collection (or since it
    /// was added) and starts a new interval for it. Other consumers keep what
    /// this scan found until they collect.
    pub fn collect_for(&mut self, id: ConsumerId) -> Result<Collection> {
        if !matches!(self.pending.get(id.0), Some(Some(_))) {
            return Err(Error::NoConsumer { id: id.0 });
        }
        let t0 = Instant::now();
        let mut stats = CollectStats::default();
        let mut fresh = Vec::new();
        self.backend.scan(&mut fresh, &mut stats)?;
        let regions = self.backend.regions();
        let mut mine = Vec::new();
        for (i, slot) in self.pending.iter_mut().enumerate() {
            let Some(p) = slot else { continue };
            if i == id.0 {
                mine = region::clip_to(&region::union_sorted(&std::mem::take(p), &fresh), &regions);
            } else if !fresh.is_empty() {
                *p = region::clip_to(&region::union_sorted(p, &fresh), &regions);
            }
        }
        Ok(Collection::finish(mine, stats, &regions, t0))
    }
}
