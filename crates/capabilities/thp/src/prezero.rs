//! Pre-zeroed huge pages (HawkEye's asynchronous pre-zeroing, from user
//! space): a background thread of the process faults huge pages in ahead of
//! where its memory grows, so that the program's first touch of a new 2 MiB
//! finds it present instead of waiting while the kernel zeroes it.
//!
//! The thread looks, every `scan` interval, at the process's private
//! anonymous writable mappings that already hold a huge page (so the kernel
//! gives them huge pages on a fault: THP `always`, or `MADV_HUGEPAGE`). In
//! each, the *frontier* is the last 2 MiB region holding data (the first
//! word of one of its pages is not zero); the resident regions after it
//! that hold nothing yet are the pool, and regions past the last resident
//! one are faulted in with `MADV_POPULATE_WRITE` (the kernel zeroes a huge
//! page for each, in this thread's time) until the pool holds `ahead`. That fits memory that grows
//! forward (a heap top, a buffer filled in order); memory touched in random
//! order gains nothing and costs up to `ahead` huge pages per mapping.
//!
//! `MADV_POPULATE_WRITE` only faults pages in: a page the program wrote
//! meanwhile keeps its contents (the fault finds it present), so no write
//! can be lost. It is limited to `rate` huge pages per second.

use pagewise_mech::walk::PageWalker;
use pagewise_mech::{procfs, shim};
use pagewise_mech::{Region, Result, HUGE_PAGE_SIZE, PAGE_SIZE};
use pagewise_sys::pagemap::category as cat;
use serde::Serialize;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::process::{Child, Command};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How the pre-zeroing thread runs.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct PrezeroOptions {
    /// Huge pages kept faulted in ahead of each growing mapping.
    pub ahead: u64,
    /// Most huge pages faulted in per second.
    pub rate: f64,
    /// Time between looks.
    pub scan: Duration,
}

setters!(PrezeroOptions {
    ahead: u64,
    rate: f64,
    scan: Duration,
});

impl Default for PrezeroOptions {
    fn default() -> Self {
        PrezeroOptions {
            ahead: 2,
            rate: 500.0,
            scan: Duration::from_micros(500),
        }
    }
}

/// What the thread has done.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
pub struct PrezeroStats {
    /// Huge pages faulted in ahead.
    pub populated: u64,
    /// Looks taken.
    pub scans: u64,
    /// The thread's CPU time, ms.
    pub cpu_ms: f64,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    populated: AtomicU64,
    scans: AtomicU64,
    cpu_us: AtomicU64,
}

/// The magic of the report the shim sends as a pre-zeroed program exits:
/// `PGWZ`.
pub(crate) const REPORT_MAGIC: u32 = u32::from_le_bytes(*b"PGWZ");
/// The report's length: the hello header (magic, contract) and three
/// `u64`s, little-endian: huge pages populated, looks taken, the thread's
/// CPU time in µs.
pub(crate) const REPORT_LEN: usize = 8 + 24;

impl PrezeroStats {
    /// The report of these statistics (see `REPORT_LEN`).
    pub fn encode(&self) -> [u8; REPORT_LEN] {
        let mut b = [0u8; REPORT_LEN];
        b[..8].copy_from_slice(&pagewise_mech::shim::hello_header(REPORT_MAGIC));
        b[8..16].copy_from_slice(&self.populated.to_le_bytes());
        b[16..24].copy_from_slice(&self.scans.to_le_bytes());
        let us = (self.cpu_ms * 1e3).max(0.0) as u64;
        b[24..32].copy_from_slice(&us.to_le_bytes());
        b
    }

    /// Reads a report: its header checked (magic, contract), then the
    /// three counts.
    pub fn decode(r: &mut impl Read) -> std::io::Result<PrezeroStats> {
        pagewise_mech::shim::check_hello(r, REPORT_MAGIC)?;
        let mut b = [0u8; 24];
        r.read_exact(&mut b)?;
        let u = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Ok(PrezeroStats {
            populated: u(0),
            scans: u(8),
            cpu_ms: u(16) as f64 / 1e3,
        })
    }
}

/// A program started with the shim pre-zeroing in it
/// ([`start_prezeroed`]), and the socket its report comes on.
pub struct Prezeroed {
    /// The program.
    pub child: Child,
    report: UnixStream,
}

impl Prezeroed {
    /// What the pre-zeroing thread did, sent by the shim as the program
    /// exited (read within `within` once it has); `Err` when no report
    /// came: the program was killed, ended with `_exit`, or did not load
    /// the shim (statically linked, setuid).
    pub fn report(mut self, within: Duration) -> std::io::Result<PrezeroStats> {
        self.report.set_read_timeout(Some(within))?;
        PrezeroStats::decode(&mut self.report)
    }
}

/// Pre-zeroing asked of the shim (`pagewise thp prezero`), in
/// [`shim::env::PREZERO`]; `None` fields take the library's defaults.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
#[non_exhaustive]
pub struct PrezeroRequest {
    /// Huge pages kept ahead.
    pub ahead: Option<u64>,
    /// Most huge pages zeroed per second.
    pub rate: Option<f64>,
    /// The shim's end of a socketpair on which it sends its report
    /// ([`PrezeroStats::encode`]) as the program exits.
    pub report: Option<i32>,
}

impl PrezeroRequest {
    /// The value of [`shim::env::PREZERO`] that asks for this, for the
    /// process `owner` names where it is given.
    fn spec(&self, owner: Option<&str>) -> String {
        let part = |v: Option<String>| v.unwrap_or_default();
        let mut s = format!(
            "{},{},{}",
            part(self.ahead.map(|a| a.to_string())),
            part(self.rate.map(|r| r.to_string())),
            part(self.report.map(|f| f.to_string()))
        );
        if let Some(o) = owner {
            s.push(',');
            s.push_str(o);
        }
        s
    }

    /// Writes this request (taken in the shim at start-up, which removed
    /// its variable) back into the environment without its report, for
    /// this process alone: the program after an `exec` (the same process)
    /// is pre-zeroed again, its children (other processes) are not.
    pub fn keep_for_exec(&self) {
        let again = PrezeroRequest {
            report: None,
            ..*self
        };
        std::env::set_var(shim::env::PREZERO, again.spec(Some(&this_process())));
    }
}

/// This process, as the owner of a pre-zeroing request names it
/// (`PID:START`, see [`shim::env::PREZERO`]).
fn this_process() -> String {
    let pid = std::process::id();
    let start = procfs::start_time(pid as i32).unwrap_or(0);
    format!("{pid}:{start}")
}

impl shim::Request for PrezeroRequest {
    const KEY: &'static str = shim::env::PREZERO;
    const VARS: &'static [&'static str] = &[shim::env::PREZERO];
    const INHERITED: bool = false;
    fn encode(&self, set: &mut dyn FnMut(&'static str, String)) {
        set(shim::env::PREZERO, self.spec(None));
    }
    fn decode(
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> std::result::Result<Option<Self>, String> {
        let Some(spec) = get(shim::env::PREZERO) else {
            return Ok(None);
        };
        let parts: Vec<String> = spec.split(',').map(|p| p.trim().to_string()).collect();
        let part = |i: usize| parts.get(i).cloned();
        // Each part read as the variable it is, so that a bad one is named.
        let field = |i: usize| move |_: &'static str| part(i);
        let req = PrezeroRequest {
            ahead: shim::parsed(&field(0), shim::env::PREZERO)?,
            rate: shim::parsed(&field(1), shim::env::PREZERO)?,
            report: shim::parsed_fd(&field(2), shim::env::PREZERO)?,
        };
        // Written back by the shim of the process it was for: kept after
        // that process's exec, not taken by its children.
        match part(3).filter(|o| !o.is_empty()) {
            Some(owner) if owner != this_process() => Ok(None),
            _ => Ok(Some(req)),
        }
    }
}

/// Starts `cmd` with the shim pre-zeroing huge pages in it as `opts` says
/// (its `scan` is the library's), the command set up further by `setup`
/// (its standard streams, say). The shim reports on the returned socket
/// as the program exits.
pub fn start_prezeroed(
    cmd: &[String],
    opts: &PrezeroOptions,
    setup: impl FnOnce(&mut Command),
) -> Result<Prezeroed> {
    let (child, report) = shim::spawn_with_socket(
        cmd,
        |c, fd| {
            let req = PrezeroRequest {
                ahead: Some(opts.ahead),
                rate: Some(opts.rate),
                report: Some(fd),
            };
            shim::ask(c, &req)
        },
        setup,
    )?;
    Ok(Prezeroed { child, report })
}

/// The running pre-zeroing thread; stopped (and joined) when dropped.
pub struct Prezeroer {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Whether the huge region at `start` holds anything but zeros: the first
/// word of each of its pages, read with `process_vm_readv` (a region the
/// program unmaps meanwhile reads as nothing, never a fault).
fn holds_data(pid: i32, start: u64, words: &mut [[u8; 8]]) -> bool {
    let mut parts: Vec<(u64, &mut [u8])> = words
        .iter_mut()
        .enumerate()
        .map(|(k, w)| (start + (k * PAGE_SIZE) as u64, &mut w[..]))
        .collect();
    if pagewise_mech::remote::read_many(pid, &mut parts).is_err() {
        return true;
    }
    words.iter().any(|w| *w != [0u8; 8])
}

/// The huge regions to fault in now: per eligible mapping, past the last
/// region holding data (the program's frontier), enough regions to have
/// `ahead` resident ones holding nothing yet.
fn due(walker: &mut PageWalker, ahead: u64, pid: i32) -> Result<Vec<Region>> {
    let huge = HUGE_PAGE_SIZE as u64;
    let mut out = Vec::new();
    let mut runs = Vec::new();
    let mut words = vec![[0u8; 8]; HUGE_PAGE_SIZE / PAGE_SIZE];
    for m in procfs::writable_anonymous(None)? {
        if m.kind() != procfs::MemoryKind::PrivateAnonymous || m.len() < 2 * huge {
            continue;
        }
        let r = Region::new(m.start, m.len())?;
        walker.categories(r, cat::PRESENT, cat::PRESENT | cat::HUGE, &mut runs)?;
        if !runs.iter().any(|p| p.categories & cat::HUGE != 0) {
            continue;
        }
        let Some(last) = runs.last() else { continue };
        // Resident regions from the last one back: those holding nothing
        // yet are the pool ahead; the first holding data is the frontier.
        let end = last.end.div_ceil(huge) * huge;
        let mut pool = 0;
        let mut at = end;
        while at >= m.start + huge && pool < ahead {
            let start = at - huge;
            if start < m.start.div_ceil(huge) * huge || holds_data(pid, start, &mut words) {
                break;
            }
            pool += 1;
            at = start;
        }
        let mut next = end;
        for _ in pool..ahead {
            if next + huge > m.end {
                break;
            }
            out.push(Region::new(next, huge)?);
            next += huge;
        }
    }
    Ok(out)
}

fn run(shared: &Shared, opts: &PrezeroOptions) {
    let Ok(mut walker) = PageWalker::new(None) else {
        return;
    };
    let pid = std::process::id() as i32;
    let mut allowance = 0.0f64;
    let mut last = Instant::now();
    while !shared.stop.load(Ordering::Relaxed) {
        std::thread::sleep(opts.scan);
        let now = Instant::now();
        allowance = (allowance + now.duration_since(last).as_secs_f64() * opts.rate)
            .min(opts.rate.max(1.0) * 0.1);
        last = now;
        shared.scans.fetch_add(1, Ordering::Relaxed);
        let Ok(regions) = due(&mut walker, opts.ahead, pid) else {
            continue;
        };
        for r in regions {
            if allowance < 1.0 {
                break;
            }
            // A page in it may have been touched since the look: the
            // populate then leaves it as it is.
            // The advice only faults pages in, never changes what a resident
            // page holds; an unmapped range is an error, ignored.
            let ok = pagewise_sys::mem::advise(
                r.start,
                r.len as usize,
                pagewise_sys::mem::MADV_POPULATE_WRITE,
            )
            .is_ok();
            if ok {
                allowance -= 1.0;
                shared.populated.fetch_add(1, Ordering::Relaxed);
            }
        }
        shared.cpu_us.store(
            pagewise_sys::process::thread_cpu_ns() / 1000,
            Ordering::Relaxed,
        );
    }
}

impl Prezeroer {
    /// Starts the thread in this process.
    pub fn start(opts: PrezeroOptions) -> Result<Prezeroer> {
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread =
            pagewise_sys::signal::spawn_quiet("pagewise-prezero".into(), move || run(&s, &opts))
                .map_err(|e| pagewise_mech::Error::os("starting the pre-zeroing thread", e))?;
        Ok(Prezeroer {
            shared,
            thread: Some(thread),
        })
    }

    /// What it has done so far.
    pub fn stats(&self) -> PrezeroStats {
        PrezeroStats {
            populated: self.shared.populated.load(Ordering::Relaxed),
            scans: self.shared.scans.load(Ordering::Relaxed),
            cpu_ms: self.shared.cpu_us.load(Ordering::Relaxed) as f64 / 1e3,
        }
    }
}

impl Drop for Prezeroer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod request_tests {
    use super::*;

    #[test]
    fn a_prezeroing_request_goes_through_its_variable_unchanged() {
        for asked in [
            PrezeroRequest {
                ahead: Some(3),
                rate: Some(1.5),
                report: Some(11),
            },
            PrezeroRequest::default(),
        ] {
            assert_eq!(shim::round_trip(&asked), Ok(Some(asked)));
        }
        // Another process's request (written back by its shim): not ours.
        let theirs = |k: &'static str| (k == shim::env::PREZERO).then(|| "1,2,,1:1".to_string());
        assert_eq!(<PrezeroRequest as shim::Request>::decode(&theirs), Ok(None));
    }
}
