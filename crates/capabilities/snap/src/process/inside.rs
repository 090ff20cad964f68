//! Resets made inside the program: AFL++'s fork server served by the
//! preload shim in the process it resets ([`init`]), with no `ptrace`
//! stop and no copy between processes on the way of an execution.
//! [`super::afl::serve`] starts the program with the shim and this
//! request ([`ResetRequest`]), and falls back to the reset from outside
//! ([`super::session`]) where the shim refuses.
//!
//! At start-up the shim installs a `SIGSYS` handler (on an alternate stack
//! of its own) and a seccomp filter that turns into `SIGSYS` the calls of
//! the C library that change what a reset must put back: the first `read`
//! of the input descriptor, `exit_group`, the break and mappings (`brk`,
//! `mmap`, `munmap`, `mremap`, `mprotect`), the descriptors the point held
//! (`close`, `dup2`, `dup3`, `close_range`), a new thread
//! (`set_robust_list`, which each thread of the C library makes as it
//! starts), and the signal calls that would take `SIGSYS` from the shim
//! (`rt_sigaction`, `rt_sigprocmask`, `sigaltstack`).
//!
//! - **The point** is taken in the handler of the program's first `read`
//!   of its input, before it is made: the interrupted registers, `XSAVE`
//!   area and signal mask (the signal frame's), a copy of every private
//!   writable mapping but the shim's own (kept in the shim's memory, where
//!   a `memcpy` reaches it), each 2 MiB block of it anonymous and
//!   populated whole collapsed into a huge page (a reset walks one entry
//!   for it until a run writes it), write-protected with a userfaultfd in
//!   asynchronous mode, the break, the descriptor table and the regular
//!   files' offsets. A program with more than one thread, or an alternate
//!   signal stack of its own, is refused (the reset from outside takes it).
//! - **A run** ends at `exit_group`: the handler tells AFL++ the status,
//!   waits for the next control word, and resets: the break put back
//!   (pages the program gave back are mapped, registered and copied
//!   again), mappings made since unmapped, the pages written since found
//!   by one `PAGEMAP_SCAN` and copied back from the point, then protected
//!   again, descriptors opened since closed, offsets put back; the signal
//!   frame becomes the point's, and the handler makes the `read` the point
//!   interrupted. The return from the handler (`rt_sigreturn`) puts every
//!   register back.
//! - **What it cannot put back** (a mapping of the point unmapped, moved
//!   or re-protected, a descriptor of the point closed or replaced, a
//!   thread made, the alternate stack replaced) is seen as the call is
//!   made; the run goes on, and at its end the shim tells why on the board
//!   and ends the process, which pagewise starts again.
//!
//! Not seen: calls made by code outside the C library (a program that
//! makes its own system calls), signal dispositions changed during a run
//! (the quick path from outside leaves them too), and `madvise` (a page a
//! program gives back reads as written, and is copied back).

use pagewise_mech::shim::{env, parsed_fd, Request};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};

/// What pagewise asks of the shim ([`env::RESET`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ResetRequest {
    /// The descriptor the program reads its input from.
    pub input: i32,
    /// AFL++'s control pipe, as passed to the program.
    pub control: i32,
    /// AFL++'s status pipe, as passed to the program.
    pub status: i32,
    /// The [`Board`]'s memory file.
    pub board: i32,
    /// The control word of the next run was read already (by the program
    /// before this one, which ended before it told its pid).
    pub control_read: bool,
    /// Collapse the point's anonymous state into huge pages where it is
    /// populated whole (the default; see the module).
    pub huge_pages: bool,
}

impl ResetRequest {
    /// A request of these descriptors.
    pub fn new(input: i32, control: i32, status: i32, board: i32, control_read: bool) -> Self {
        ResetRequest {
            input,
            control,
            status,
            board,
            control_read,
            huge_pages: true,
        }
    }

    /// The same request, with the point's state collapsed into huge pages
    /// (`true`) or left in the pages it is in.
    pub(crate) fn with_huge_pages(mut self, on: bool) -> Self {
        self.huge_pages = on;
        self
    }
}

impl Request for ResetRequest {
    const KEY: &'static str = env::RESET;
    const VARS: &'static [&'static str] = &[env::RESET];
    const INHERITED: bool = false;
    fn encode(&self, set: &mut dyn FnMut(&'static str, String)) {
        set(
            env::RESET,
            format!(
                "{},{},{},{},{},{}",
                self.input,
                self.control,
                self.status,
                self.board,
                self.control_read as u8,
                self.huge_pages as u8
            ),
        );
    }
    fn decode(
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> std::result::Result<Option<Self>, String> {
        let Some(v) = get(env::RESET) else {
            return Ok(None);
        };
        let parts: Vec<&str> = v.split(',').collect();
        let bad = || {
            format!(
                "{}={v:?} is not INPUT,CONTROL,STATUS,BOARD,READ,HUGE",
                env::RESET
            )
        };
        if parts.len() != 6 {
            return Err(bad());
        }
        let mut n = [0i32; 6];
        for (i, p) in parts.iter().enumerate() {
            let one = |_: &'static str| Some(p.to_string());
            n[i] = parsed_fd(&one, env::RESET)
                .map_err(|_| bad())?
                .ok_or_else(bad)?;
        }
        if n[4] > 1 || n[5] > 1 {
            return Err(bad());
        }
        let req = ResetRequest::new(n[0], n[1], n[2], n[3], n[4] == 1);
        Ok(Some(req.with_huge_pages(n[5] == 1)))
    }
}

/// Where the program stands in AFL++'s protocol ([`Board::stage`]).
pub mod stage {
    /// Started, its point not taken yet.
    pub const STARTING: u32 = 0;
    /// Waiting for the next control word (the last status told).
    pub const IDLE: u32 = 1;
    /// The control word read, the pid not told yet.
    pub const OWES_PID: u32 = 2;
    /// Running an input: the pid told, the status owed.
    pub const RUNNING: u32 = 3;
    /// AFL++ closed the control pipe: the program ended.
    pub const GONE: u32 = 4;
}

const BOARD_MAGIC: u64 = 0x5047_5752_4553_4554; // "PGWRESET"
const WHY: usize = 240;

/// The memory pagewise and the shim share for one program: where it stands
/// in the protocol, what its resets cost, and why it refused or ended.
#[repr(C)]
#[derive(Debug)]
pub struct Board {
    magic: AtomicU64,
    stage: AtomicU32,
    pid: AtomicI32,
    /// Runs ended whose status the shim told.
    pub runs: AtomicU64,
    /// Of them, ended by a crash the shim caught.
    pub crashes: AtomicU64,
    /// Resets made inside the program.
    pub resets: AtomicU64,
    /// Their time, nanoseconds in all.
    pub reset_ns: AtomicU64,
    /// Of it, finding the pages written (`PAGEMAP_SCAN`).
    pub walk_ns: AtomicU64,
    /// Of it, copying pages back and protecting them again.
    pub copy_ns: AtomicU64,
    /// Pages copied back (found written since the point, and the spans
    /// of a few pages copied whole), in all.
    pub pages_dirty: AtomicU64,
    /// The program's own time, from the end of a reset to the end of its
    /// run, nanoseconds in all.
    pub run_ns: AtomicU64,
    /// The point's state collapsed into huge pages, bytes.
    pub collapsed_bytes: AtomicU64,
    /// How long the point took, the collapse included, nanoseconds.
    pub point_ns: AtomicU64,
    /// Of it, collapsing the state into huge pages.
    pub collapse_ns: AtomicU64,
    /// The longest reset, nanoseconds.
    max_reset_ns: AtomicU64,
    /// Resets by time ([`bucket_of`]): 0.5 µs wide up to 256 µs, then 4
    /// µs wide up to 2304 µs; the last bucket counts those that took
    /// longer.
    hist: [AtomicU32; BUCKETS],
    refused_len: AtomicU32,
    refused: [AtomicU8; WHY],
    ended_len: AtomicU32,
    ended: [AtomicU8; WHY],
}

/// The board's size in its memory file.
pub const BOARD_BYTES: usize = 8192;
/// The width of the first half of the buckets of [`Board`]'s histogram
/// of resets; the second half's are eight times as wide.
pub const BUCKET_NS: u64 = 500;
/// The histogram's buckets.
pub(crate) const BUCKETS: usize = 1024;
const HALF: usize = BUCKETS / 2;

/// The bucket of a reset of `ns` nanoseconds.
fn bucket_of(ns: u64) -> usize {
    let fine = (ns / BUCKET_NS) as usize;
    if fine < HALF {
        return fine;
    }
    let coarse = ((ns - HALF as u64 * BUCKET_NS) / (8 * BUCKET_NS)) as usize;
    (HALF + coarse).min(BUCKETS - 1)
}

/// Where bucket `i` starts, nanoseconds.
fn bucket_start(i: usize) -> u64 {
    if i < HALF {
        i as u64 * BUCKET_NS
    } else {
        HALF as u64 * BUCKET_NS + (i - HALF) as u64 * 8 * BUCKET_NS
    }
}
const _: () = assert!(std::mem::size_of::<Board>() <= BOARD_BYTES);

impl Board {
    /// The board in memory `p` (a shared mapping of [`BOARD_BYTES`] of a
    /// memory file), made ready with `fresh` (pagewise's side, once).
    ///
    /// # Safety
    /// `p` is a mapping of at least [`BOARD_BYTES`], aligned, that lives
    /// as long as the reference.
    pub unsafe fn at(p: *mut u8, fresh: bool) -> &'static Board {
        // SAFETY: the caller vouches for the memory; every field is an
        // atomic, valid for any bytes (zeros: a fresh board).
        let b = unsafe { &*(p as *const Board) };
        if fresh {
            b.magic.store(BOARD_MAGIC, Ordering::Release);
        }
        b
    }

    /// Whether pagewise made this board.
    pub fn is_ready(&self) -> bool {
        self.magic.load(Ordering::Acquire) == BOARD_MAGIC
    }

    /// Where the program stands ([`stage`]).
    pub fn stage(&self) -> u32 {
        self.stage.load(Ordering::Acquire)
    }

    fn set_stage(&self, s: u32) {
        self.stage.store(s, Ordering::Release);
    }

    /// Counts a reset that took `ns` nanoseconds in the histogram
    /// (signal-safe: atomics alone).
    fn record_reset(&self, ns: u64) {
        let i = bucket_of(ns);
        self.hist[i].fetch_add(1, Ordering::Relaxed);
        self.max_reset_ns.fetch_max(ns, Ordering::Relaxed);
    }

    /// Adds this board's resets to `into`, bucket by bucket (see
    /// [`ResetSpread::of`]), and gives its longest reset.
    pub(crate) fn add_hist(&self, into: &mut [u64; BUCKETS]) -> u64 {
        for (a, h) in into.iter_mut().zip(&self.hist) {
            *a += h.load(Ordering::Relaxed) as u64;
        }
        self.max_reset_ns.load(Ordering::Relaxed)
    }

    /// Why the shim refused to reset the program inside it, if it did.
    pub fn refused(&self) -> Option<String> {
        read_why(&self.refused_len, &self.refused)
    }

    /// Why the shim ended the program after a run, if it did (what a reset
    /// inside it could not put back).
    pub fn ended(&self) -> Option<String> {
        read_why(&self.ended_len, &self.ended)
    }
}

/// How long the resets made inside took, from the boards' histograms:
/// each figure is the upper edge of its bucket (0.5 µs wide up to
/// 256 µs, 4 µs up to 2304 µs), the longest exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ResetSpread {
    /// Resets counted.
    pub resets: u64,
    /// Median, microseconds.
    pub p50_us: f64,
    /// 99th percentile, microseconds.
    pub p99_us: f64,
    /// Shortest, microseconds.
    pub min_us: f64,
    /// Longest, microseconds.
    pub max_us: f64,
}

/// The histogram's buckets, summed over programs.
pub(crate) type Hist = [u64; BUCKETS];

impl ResetSpread {
    /// The spread of the resets counted in `hist`, the longest `max_ns`;
    /// `None` where none was.
    pub(crate) fn of(hist: &Hist, max_ns: u64) -> Option<ResetSpread> {
        let n: u64 = hist.iter().sum();
        if n == 0 {
            return None;
        }
        let edge = |i: usize| match i {
            // The last bucket has no upper edge but the longest reset.
            _ if i == BUCKETS - 1 => max_ns as f64 / 1e3,
            _ => bucket_start(i + 1).min(max_ns) as f64 / 1e3,
        };
        // The bucket of the `rank`-th reset (from 1).
        let at = |rank: u64| {
            let mut seen = 0;
            for (i, &c) in hist.iter().enumerate() {
                seen += c;
                if seen >= rank {
                    return edge(i);
                }
            }
            max_ns as f64 / 1e3
        };
        let first = hist.iter().position(|&c| c > 0).unwrap_or(0);
        Some(ResetSpread {
            resets: n,
            p50_us: at(n.div_ceil(2)),
            p99_us: at((n * 99).div_ceil(100)),
            min_us: bucket_start(first) as f64 / 1e3,
            max_us: max_ns as f64 / 1e3,
        })
    }
}

fn read_why(len: &AtomicU32, bytes: &[AtomicU8; WHY]) -> Option<String> {
    let n = (len.load(Ordering::Acquire) as usize).min(WHY);
    if n == 0 {
        return None;
    }
    let v: Vec<u8> = bytes[..n]
        .iter()
        .map(|b| b.load(Ordering::Relaxed))
        .collect();
    Some(String::from_utf8_lossy(&v).into_owned())
}

/// Writes `parts` one after the other (signal-safe: no allocation).
fn write_why(len: &AtomicU32, bytes: &[AtomicU8; WHY], parts: &[&[u8]]) {
    let mut n = 0;
    for p in parts {
        for &c in *p {
            if n < WHY {
                bytes[n].store(c, Ordering::Relaxed);
                n += 1;
            }
        }
    }
    len.store(n as u32, Ordering::Release);
}

/// A number in decimal, without allocating.
fn decimal(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

#[cfg(target_arch = "x86_64")]
mod imp;

#[cfg(target_arch = "x86_64")]
pub use imp::init;

/// Resets inside the program are made on x86-64 alone: elsewhere the shim
/// refuses, and pagewise resets from outside.
#[cfg(not(target_arch = "x86_64"))]
pub fn init(req: ResetRequest) {
    let _ = req;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reset_request_goes_through_its_variable_unchanged() {
        let asked = ResetRequest::new(0, 1000, 1001, 1002, true);
        assert_eq!(pagewise_mech::shim::round_trip(&asked), Ok(Some(asked)));
        let base = asked.with_huge_pages(false);
        assert_eq!(pagewise_mech::shim::round_trip(&base), Ok(Some(base)));
        for bad in [
            "0,1,2",
            "0,1,2,3,4",
            "0,x,2,3,0,1",
            "0,-1,2,3,0,1",
            "0,1,2,3,0,2",
        ] {
            let get = |k: &'static str| (k == env::RESET).then(|| bad.to_string());
            let e = ResetRequest::decode(&get).unwrap_err();
            assert!(e.contains(env::RESET), "{bad}: {e}");
        }
    }

    #[test]
    fn a_reason_is_read_back_as_written_and_cut_at_its_room() {
        let mem = vec![0u64; BOARD_BYTES / 8];
        // SAFETY: an aligned buffer of BOARD_BYTES that outlives the board.
        let b = unsafe { Board::at(mem.as_ptr() as *mut u8, true) };
        assert!(b.is_ready());
        assert_eq!(b.refused(), None);
        let mut n = [0u8; 20];
        write_why(
            &b.refused_len,
            &b.refused,
            &[b"descriptor ", decimal(1007, &mut n), b" was closed"],
        );
        assert_eq!(b.refused().as_deref(), Some("descriptor 1007 was closed"));
        let long = [b'x'; 400];
        write_why(&b.ended_len, &b.ended, &[&long]);
        assert_eq!(b.ended().map(|s| s.len()), Some(WHY));
        assert_eq!(decimal(0, &mut n), b"0");
    }

    #[test]
    fn the_spread_of_resets_is_read_from_the_histogram() {
        let mem = vec![0u64; BOARD_BYTES / 8];
        // SAFETY: an aligned buffer of BOARD_BYTES that outlives the board.
        let b = unsafe { Board::at(mem.as_ptr() as *mut u8, true) };
        let mut hist: Hist = [0; BUCKETS];
        let none = b.add_hist(&mut hist);
        assert_eq!(ResetSpread::of(&hist, none), None);
        // 98 resets of 20.2 µs, one of 70.1 µs, one of 5 ms (the last
        // bucket's).
        for _ in 0..98 {
            b.record_reset(20_200);
        }
        b.record_reset(70_100);
        b.record_reset(5_000_000);
        let max = b.add_hist(&mut hist);
        let s = ResetSpread::of(&hist, max).unwrap();
        assert_eq!(s.resets, 100);
        assert_eq!((s.p50_us, s.min_us), (20.5, 20.0));
        assert_eq!(s.p99_us, 70.5);
        assert_eq!(s.max_us, 5000.0);
        // Past 256 µs, 4 µs buckets: 700.1 µs is counted in [700, 704).
        let mut far: Hist = [0; BUCKETS];
        far[bucket_of(700_100)] += 1;
        let s = ResetSpread::of(&far, 700_100).unwrap();
        assert_eq!((s.min_us, s.p50_us), (700.0, 700.1));
        assert_eq!(bucket_of(2_400_000), BUCKETS - 1);
    }
}
