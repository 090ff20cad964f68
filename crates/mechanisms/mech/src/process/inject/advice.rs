//! Advice a process takes: made inside it ([`Inside`]: by its shim, or
//! under ptrace, stopped for the moment of the call), or given from
//! outside where the kernel allows it (`MADV_COLLAPSE`).

use super::{check_target, Remote};
use crate::procfs;
use crate::stop::Stopped;
use crate::Result;

use super::shim;

/// How a process is made to call something itself: through the preload
/// shim of a program pagewise started (nothing stopped), or under ptrace
/// (any process: stopped for the moment of the call).
#[derive(Debug)]
#[non_exhaustive]
pub enum Inside {
    /// Stopped under ptrace for each request ([`madvise_in`]).
    Ptrace,
    /// Its shim's advice thread ([`shim`]).
    Shim(shim::ShimAdvice),
}

impl Inside {
    /// Makes process `pid` call `madvise(advice)` on each of `ranges`
    /// (address, bytes) itself; the bytes advised per range. `feature`
    /// names who asks, for the refusals of [`check_target`].
    pub fn madvise(
        &mut self,
        pid: i32,
        ranges: &[(u64, u64)],
        advice: i32,
        feature: &'static str,
    ) -> Result<Vec<u64>> {
        self.advise(pid, ranges, (advice, Extent::AsGiven), feature)
    }

    /// As [`madvise`](Self::madvise), each range taken as the whole
    /// mapping that holds its start when the advice is given, for advice
    /// that must not split a mapping (`MADV_MERGEABLE` on a mapping the
    /// program grows, shrinks or moves: a program whose `mremap` spans
    /// the pieces fails with `EFAULT`). Under ptrace the maps are read
    /// while the process is stopped, so the mapping advised is the one the
    /// program has; a range whose start is in no mapping then gets 0. The
    /// shim's advice thread advises the ranges as given, the program
    /// running on (a mapping grown in between is split: see the book's
    /// security limits).
    pub fn madvise_mappings(
        &mut self,
        pid: i32,
        ranges: &[(u64, u64)],
        advice: i32,
        feature: &'static str,
    ) -> Result<Vec<u64>> {
        self.advise(pid, ranges, (advice, Extent::WholeMappings), feature)
    }

    /// [`madvise`](Self::madvise) or
    /// [`madvise_mappings`](Self::madvise_mappings), as `extent` says.
    fn advise(
        &mut self,
        pid: i32,
        ranges: &[(u64, u64)],
        (advice, extent): (i32, Extent),
        feature: &'static str,
    ) -> Result<Vec<u64>> {
        match self {
            Inside::Ptrace => advise_stopped(pid, ranges, (advice, extent), feature),
            Inside::Shim(s) => s.madvise(ranges, advice),
        }
    }

    /// Whether `[start, start+len)` overlaps pagewise's own memory in the
    /// process: the shim's, as its hello named it (nothing under ptrace),
    /// or a mapping named `[anon:pagewise-…]`, which the caller checks.
    pub fn is_own_memory(&self, start: u64, len: u64) -> bool {
        match self {
            Inside::Ptrace => false,
            Inside::Shim(s) => s
                .own_memory()
                .iter()
                .any(|&(a, n)| a < start.saturating_add(len) && start < a.saturating_add(n)),
        }
    }

    /// `ptrace` or `shim`.
    pub fn name(&self) -> &'static str {
        match self {
            Inside::Ptrace => "ptrace",
            Inside::Shim(_) => "shim",
        }
    }
}

/// Collapses `[start, start+len)` of the process behind `pidfd` into huge
/// pages (`process_madvise(MADV_COLLAPSE)`, which needs no stop). The
/// kernel answers `EAGAIN` for a state that passes on its own (a page
/// locked or not yet on an LRU list, as right after copy-on-write broke a
/// KSM page): such a refusal is retried, at most [`COLLAPSE_TRIES`] times,
/// 20 ms apart. Any other refusal is answered at once.
pub fn collapse(pidfd: std::os::fd::RawFd, start: u64, len: usize) -> std::io::Result<()> {
    collapse_retried(|| {
        pagewise_sys::process::process_madvise(
            pidfd,
            &[(start, len)],
            pagewise_sys::mem::MADV_COLLAPSE,
        )
        .map(|_| ())
    })
}

/// A call of `MADV_COLLAPSE` the caller makes, retried as [`collapse`]'s.
pub(crate) fn collapse_retried(
    mut collapse: impl FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let mut tries = 1;
    loop {
        match collapse() {
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) && tries < COLLAPSE_TRIES => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => return r,
        }
    }
}

/// Most attempts [`collapse`] makes at a range the kernel says to retry.
pub const COLLAPSE_TRIES: u32 = 5;

/// What a range advised under ptrace stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Extent {
    /// The range as given.
    AsGiven,
    /// The whole mapping holding its start in the stopped process.
    WholeMappings,
}

/// Makes process `pid` call `madvise(advice)` on each of `ranges`
/// (address, bytes) itself, stopped for the moment it takes (see
/// [`Remote::madvise_many`]): for advice that the kernel accepts only from
/// the process itself, such as `MADV_MERGEABLE`. `feature` names who asks,
/// for the refusals of [`check_target`]. The bytes advised per range.
pub fn madvise_in(
    pid: i32,
    ranges: &[(u64, u64)],
    advice: i32,
    feature: &'static str,
) -> Result<Vec<u64>> {
    advise_stopped(pid, ranges, (advice, Extent::AsGiven), feature)
}

/// [`madvise_in`], each range as `extent` says: as given, or the whole
/// mapping that holds its start in the stopped process (a range whose
/// start is in no mapping then gets 0).
fn advise_stopped(
    pid: i32,
    ranges: &[(u64, u64)],
    (advice, extent): (i32, Extent),
    feature: &'static str,
) -> Result<Vec<u64>> {
    check_target(pid, feature, "the madvise call")?;
    let stopped = Stopped::new(pid)?;
    if extent == Extent::AsGiven {
        return Remote::new(&stopped)?.madvise_many(ranges, advice);
    }
    let maps = procfs::maps(Some(pid))?;
    let wholes: Vec<Option<(u64, u64)>> = ranges
        .iter()
        .map(|&(a, _)| {
            maps.iter()
                .find(|m| m.start <= a && a < m.end)
                .map(|m| (m.start, m.end - m.start))
        })
        .collect();
    let runs: Vec<(u64, u64)> = wholes.iter().flatten().copied().collect();
    let remote = Remote::new(&stopped)?;
    let mut done = remote.madvise_many(&runs, advice)?.into_iter();
    Ok(wholes
        .iter()
        .map(|w| w.and_then(|_| done.next()).unwrap_or(0))
        .collect())
}
