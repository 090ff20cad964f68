//! AFL++'s fork server, served by a reset session ([`serve`]): `afl-fuzz`
//! runs a program through pagewise, and each of its executions is a reset
//! of one process to the point just before it read its input, where the
//! fork server would fork a new one.
//!
//! The protocol (AFL++'s `afl-forkserver.c`, the version without
//! options): the server says hello with four bytes on the status
//! descriptor (199); then, for each execution, `afl-fuzz` writes four
//! bytes on the control descriptor (198), the server answers with the
//! pid of the process that runs the input, and, once it ended, with its
//! wait status (`exit` code in the second byte, or the signal in the
//! low seven bits). On a timeout `afl-fuzz` kills that pid itself and
//! reads the status; the program is then started again.
//!
//! The program reads its input from standard input (`afl-fuzz` writes
//! each input to a file it gives the server as descriptor 0; the session
//! puts the file's offset back at each reset, as the fork server's new
//! child would find it). Built with `afl-cc`, the program maps AFL++'s
//! coverage map (`__AFL_SHM_ID`) at start-up, before the point: shared
//! memory, which a reset leaves as it is. Its own fork server finds
//! descriptors 198 and 199 closed and stays out of the way.

use super::session::{ResetSession, RunEnd};
use crate::{Error, Result};
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, RawFd};
use std::time::Duration;

/// `FS_OPT_ENABLED`: the hello carries options.
const FS_OPT_ENABLED: u32 = 0x8000_0001;
/// `FS_OPT_MAPSIZE`: the hello carries the coverage map's size.
const FS_OPT_MAPSIZE: u32 = 0x4000_0000;
/// The largest map size the hello can carry.
const FS_OPT_MAX_MAPSIZE: u32 = (0x00ff_fffe >> 1) + 1;

/// The fork server's hello: with the coverage map's size where known
/// (`FS_OPT_SET_MAPSIZE`), as AFL++'s own fork server says it.
fn hello(map_size: Option<u32>) -> u32 {
    match map_size {
        Some(n) if n > 1 && n <= FS_OPT_MAX_MAPSIZE => {
            FS_OPT_ENABLED | FS_OPT_MAPSIZE | ((n - 1) << 1)
        }
        _ => 0,
    }
}

/// The size of the coverage map of a program built with `afl-cc`, as it
/// says when started with `AFL_DUMP_MAP_SIZE=1` (and ends at once, before
/// `main`); `None` for another program (given no input, and 2 s at most).
fn map_size(argv: &[OsString]) -> Option<u32> {
    let (first, rest) = argv.split_first()?;
    let mut c = std::process::Command::new(first);
    c.args(rest)
        .env("AFL_DUMP_MAP_SIZE", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    pagewise_mech::child::tie(&mut c);
    let mut child = c.spawn().ok()?;
    let ended = pagewise_mech::child::wait_for(&mut child, Duration::from_secs(2));
    if ended.is_none() {
        let _ = child.kill();
        let _ = child.wait();
        return None;
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    out.lines().next()?.trim().parse().ok()
}

/// AFL++'s control descriptor (`FORKSRV_FD`).
pub const CONTROL_FD: RawFd = 198;
/// AFL++'s status descriptor (`FORKSRV_FD + 1`).
pub const STATUS_FD: RawFd = 199;

/// Marks AFL++'s two descriptors ([`CONTROL_FD`], [`STATUS_FD`])
/// close-on-exec, so that the program served does not inherit them; the
/// first that is not open, where one is not (the server was not started
/// by afl-fuzz).
pub fn take_descriptors() -> std::result::Result<(), RawFd> {
    for fd in [CONTROL_FD, STATUS_FD] {
        pagewise_sys::process::set_cloexec(fd).map_err(|_| fd)?;
    }
    Ok(())
}

/// What a fork server served (see [`serve`]).
#[derive(Debug, Clone, Default, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ServeStats {
    /// Executions run.
    pub runs: u64,
    /// Of them, ended by a signal that would have ended the program.
    pub crashes: u64,
    /// Times the program was started (once, and again after each
    /// execution that killed it, a timeout, and each reset that failed).
    pub starts: u64,
    /// Resets that took the whole path of a restore (with each reason
    /// once).
    pub full_resets: u64,
    /// The reasons of the whole-path resets, each once.
    pub full_reasons: Vec<String>,
    /// Resets that failed, after which the program was started again.
    pub failed_resets: u64,
    /// Their reasons, each once (the first eight).
    pub failed_reasons: Vec<String>,
    /// Mean time of a reset, microseconds.
    pub reset_us: f64,
    /// Where a reset's time went, means over the runs (microseconds).
    pub reset_phases: super::session::ResetPhases,
    /// Mean time from the end of a reset to the end of the run
    /// (the program's own work), microseconds.
    pub run_us: f64,
    /// Mean pages written since the point, found at a reset.
    pub pages_dirty: f64,
    /// Resets made inside the program, by the preload shim
    /// ([`super::inside`]); the rest were made from outside.
    pub inside_resets: u64,
    /// Why the program could not be reset from inside, if it could not
    /// (it was then reset from outside).
    pub inside_refused: Option<String>,
    /// How long the resets made inside took: median, 99th percentile,
    /// shortest and longest (`None`: none was made inside).
    pub inside_reset_spread: Option<super::inside::ResetSpread>,
    /// The program's state the shim collapsed into huge pages at its
    /// point (the last program's), MiB: a reset walks one entry for each
    /// 2 MiB of it no run wrote.
    pub inside_collapsed_mib: f64,
    /// How long the last program's point took inside it, milliseconds:
    /// its copy of the state, the protection, and the collapse.
    pub inside_point_ms: f64,
    /// Of it, collapsing the state into huge pages, milliseconds.
    pub inside_collapse_ms: f64,
}

impl ServeStats {
    /// Adds one run: its reset, and the time the program then took.
    fn add(&mut self, rep: &super::session::ResetReport, run_us: f64) {
        let n = self.runs as f64;
        let mean = |m: &mut f64, x: f64| *m += (x - *m) / (n + 1.0);
        mean(&mut self.reset_us, rep.elapsed_ns as f64 / 1e3);
        mean(&mut self.run_us, run_us);
        mean(&mut self.pages_dirty, rep.pages_dirty as f64);
        let (p, q) = (&mut self.reset_phases, &rep.phases);
        mean(&mut p.stop_us, q.stop_us);
        mean(&mut p.check_us, q.check_us);
        mean(&mut p.threads_us, q.threads_us);
        mean(&mut p.walk_us, q.walk_us);
        mean(&mut p.copy_us, q.copy_us);
        mean(&mut p.resume_us, q.resume_us);
        self.runs += 1;
    }
}

/// Options of [`serve`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ServeOptions {
    /// The descriptor the program reads its input from.
    pub input_fd: RawFd,
    /// How long the program may take to reach its first read.
    pub start_limit: Duration,
    /// Reset the program from inside it where the preload shim can
    /// ([`super::inside`]; the default), else from outside.
    pub inside: bool,
    /// Inside: collapse the program's state into huge pages at its point
    /// where it is populated whole (the default).
    pub huge_pages: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            input_fd: 0,
            start_limit: Duration::from_secs(10),
            inside: true,
            huge_pages: true,
        }
    }
}

/// The wait status of a run that ended as `end`.
fn wait_status(end: RunEnd) -> i32 {
    match end {
        RunEnd::Exit(code) => (code & 0xff) << 8,
        RunEnd::Signal(sig) => sig & 0x7f,
        RunEnd::Ended(raw) => raw,
        // No status: reported as killed, as afl-fuzz's own kill would.
        RunEnd::TimedOut => libc::SIGKILL,
    }
}

fn io(what: &str, e: std::io::Error) -> Error {
    Error::Mech(pagewise_mech::Error::os(what.to_string(), e))
}

/// How often [`serve`] tells what it served so far (afl-fuzz ends a fork
/// server with `SIGTERM`, which it does not outlive).
pub const STATS_EVERY: Duration = Duration::from_secs(1);

/// Serves AFL++'s fork-server protocol on descriptors `control` and
/// `status` (see the module) for program `argv`, until `afl-fuzz` closes
/// the control descriptor; what it served, also told to `on_stats` every
/// [`STATS_EVERY`], at once after the first reset that failed, and at
/// the end.
pub fn serve(
    argv: &[OsString],
    control: RawFd,
    status: RawFd,
    opts: &ServeOptions,
    on_stats: &mut dyn FnMut(&ServeStats),
) -> Result<ServeStats> {
    // SAFETY: the caller hands over both descriptors, which this function
    // owns from now on (closed when it returns).
    let (mut ctl, mut st) = unsafe {
        (
            std::fs::File::from_raw_fd(control),
            std::fs::File::from_raw_fd(status),
        )
    };
    let mut stats = ServeStats::default();
    let size = map_size(argv);
    let mut pending = vec![hello(size)];
    if opts.inside {
        match serve_inside(
            argv,
            &ctl,
            &mut st,
            opts,
            &mut stats,
            on_stats,
            &mut pending,
        )? {
            None => {
                on_stats(&stats);
                return Ok(stats);
            }
            Some(why) => {
                stats.inside_refused = Some(why);
                on_stats(&stats);
            }
        }
    }
    let start = |stats: &mut ServeStats| {
        stats.starts += 1;
        ResetSession::launch(argv, opts.input_fd, &[control, status], opts.start_limit)
    };
    // Started first, then the hello (and any status owed): what the
    // program does as it starts lands in the coverage map before
    // afl-fuzz clears it for the first run.
    let mut session = Some(start(&mut stats)?);
    for w in pending {
        st.write_all(&w.to_ne_bytes())
            .map_err(|e| io("writing to afl-fuzz's status descriptor", e))?;
    }
    let mut word = [0u8; 4];
    let mut told = std::time::Instant::now();
    loop {
        if told.elapsed() >= STATS_EVERY {
            on_stats(&stats);
            told = std::time::Instant::now();
        }
        match ctl.read_exact(&mut word) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                on_stats(&stats);
                return Ok(stats);
            }
            Err(e) => return Err(io("reading the fork server's control descriptor", e)),
        }
        if session.is_none() {
            session = Some(start(&mut stats)?);
        }
        let rep = match session.as_mut().expect("started above").reset() {
            Ok(rep) => rep,
            // The point cannot be put back (threads made, a layout the
            // restore refuses): the program is started again, as a fork
            // server without a snapshot would, and the reason kept.
            Err(e) => {
                failed(&mut stats, e.to_string(), on_stats);
                session = None;
                let fresh = session.insert(start(&mut stats)?);
                fresh.reset()?
            }
        };
        let s = session.as_mut().expect("started above");
        let ran = std::time::Instant::now();
        if let Some(why) = &rep.full {
            stats.full_resets += 1;
            if !stats.full_reasons.contains(why) {
                stats.full_reasons.push(why.clone());
            }
        }
        st.write_all(&s.pid().to_ne_bytes())
            .map_err(|e| io("writing the pid of a run", e))?;
        let end = s.wait_end(None)?;
        stats.add(&rep, ran.elapsed().as_secs_f64() * 1e6);
        match end {
            RunEnd::Signal(_) => stats.crashes += 1,
            RunEnd::Ended(_) => session = None,
            _ => {}
        }
        st.write_all(&wait_status(end).to_ne_bytes())
            .map_err(|e| io("writing the status of a run", e))?;
    }
}

/// Sums over the programs served inside, to make [`ServeStats`] of.
#[derive(Clone)]
struct Sums {
    runs: u64,
    crashes: u64,
    resets: u64,
    reset_ns: u64,
    walk_ns: u64,
    copy_ns: u64,
    run_ns: u64,
    pages: u64,
    /// Crashes that ended the program (not caught by the shim).
    killed: u64,
    /// The resets' histogram, bucket by bucket, and the longest.
    hist: Box<super::inside::Hist>,
    max_reset_ns: u64,
    /// The last program's state collapsed into huge pages at its point.
    collapsed: u64,
    /// The last program's point: its time, and the collapse's in it.
    point_ns: u64,
    collapse_ns: u64,
}

impl Default for Sums {
    fn default() -> Self {
        Sums {
            runs: 0,
            crashes: 0,
            resets: 0,
            reset_ns: 0,
            walk_ns: 0,
            copy_ns: 0,
            run_ns: 0,
            pages: 0,
            killed: 0,
            hist: Box::new([0; super::inside::BUCKETS]),
            max_reset_ns: 0,
            collapsed: 0,
            point_ns: 0,
            collapse_ns: 0,
        }
    }
}

impl Sums {
    fn plus(mut self, b: &super::inside::Board) -> Self {
        let l = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        self.runs += l(&b.runs);
        self.crashes += l(&b.crashes);
        self.resets += l(&b.resets);
        self.reset_ns += l(&b.reset_ns);
        self.walk_ns += l(&b.walk_ns);
        self.copy_ns += l(&b.copy_ns);
        self.run_ns += l(&b.run_ns);
        self.pages += l(&b.pages_dirty);
        if l(&b.point_ns) > 0 {
            self.collapsed = l(&b.collapsed_bytes);
            self.point_ns = l(&b.point_ns);
            self.collapse_ns = l(&b.collapse_ns);
        }
        let max = b.add_hist(&mut self.hist);
        self.max_reset_ns = self.max_reset_ns.max(max);
        self
    }

    fn write_stats(&self, stats: &mut ServeStats) {
        let per = |ns: u64, n: u64| {
            if n == 0 {
                0.0
            } else {
                ns as f64 / n as f64 / 1e3
            }
        };
        stats.runs = self.runs;
        stats.crashes = self.crashes + self.killed;
        stats.inside_resets = self.resets;
        stats.reset_us = per(self.reset_ns, self.resets);
        stats.reset_phases.walk_us = per(self.walk_ns, self.resets);
        stats.reset_phases.copy_us = per(self.copy_ns, self.resets);
        stats.run_us = per(self.run_ns, self.runs);
        stats.pages_dirty = per(self.pages * 1000, self.resets);
        stats.inside_reset_spread = super::inside::ResetSpread::of(&self.hist, self.max_reset_ns);
        stats.inside_collapsed_mib = self.collapsed as f64 / (1 << 20) as f64;
        stats.inside_point_ms = self.point_ns as f64 / 1e6;
        stats.inside_collapse_ms = self.collapse_ns as f64 / 1e6;
    }
}

/// Counts a reset that failed, with its reason (the first eight kept),
/// and tells the first at once (for the warning).
fn failed(stats: &mut ServeStats, why: String, on_stats: &mut dyn FnMut(&ServeStats)) {
    stats.failed_resets += 1;
    if stats.failed_reasons.len() < 8 && !stats.failed_reasons.contains(&why) {
        stats.failed_reasons.push(why);
    }
    if stats.failed_resets == 1 {
        on_stats(stats);
    }
}

/// A board shared with one program: its memory file and mapping.
struct SharedBoard {
    fd: std::os::fd::OwnedFd,
    mem: *mut u8,
}

impl SharedBoard {
    fn new() -> Result<Self> {
        use super::inside::BOARD_BYTES;
        use std::os::fd::AsFd;
        let fd = pagewise_sys::mem::memfd(c"pagewise-reset-board", BOARD_BYTES as u64)
            .map_err(|e| io("making the reset board", e))?;
        let mem = pagewise_sys::mem::mmap_shared_file(fd.as_fd(), BOARD_BYTES, true)
            .map_err(|e| io("mapping the reset board", e))?;
        // SAFETY: a fresh shared mapping of BOARD_BYTES, unmapped on drop
        // (the board is not used past it).
        unsafe { super::inside::Board::at(mem, true) };
        Ok(SharedBoard { fd, mem })
    }

    fn board(&self) -> &super::inside::Board {
        // SAFETY: made ready in `new`, mapped while self lives.
        unsafe { super::inside::Board::at(self.mem, false) }
    }
}

impl Drop for SharedBoard {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, no longer referenced.
        unsafe { libc::munmap(self.mem.cast(), super::inside::BOARD_BYTES) };
    }
}

/// Serves the protocol with resets made inside the program (see
/// [`super::inside`]): the program, started with the shim, answers
/// afl-fuzz itself; this side starts it again whenever it ends, and tells
/// afl-fuzz the status of a run it did not end itself (a crash, afl-fuzz's
/// own kill at a timeout). The words `pending` (the hello, a status owed)
/// are told once a program stands at its point, so that nothing it does
/// as it starts lands in the coverage map of a run; those left when it
/// returns are the caller's to tell. `Ok(None)`: afl-fuzz closed the
/// control pipe; `Ok(Some(why))`: the program cannot be reset from
/// inside.
fn serve_inside(
    argv: &[OsString],
    ctl: &std::fs::File,
    st: &mut std::fs::File,
    opts: &ServeOptions,
    stats: &mut ServeStats,
    on_stats: &mut dyn FnMut(&ServeStats),
    pending: &mut Vec<u32>,
) -> Result<Option<String>> {
    use super::inside::{stage, ResetRequest};
    use std::os::fd::{AsFd, AsRawFd};
    use std::os::unix::process::ExitStatusExt;
    if !cfg!(target_arch = "x86_64") {
        return Ok(Some(
            "resets inside the program are made on x86-64 alone".into(),
        ));
    }
    let preload = match pagewise_mech::shim::ld_preload() {
        Ok(p) => p,
        Err(e) => return Ok(Some(e.to_string())),
    };
    let (first, rest) = argv
        .split_first()
        .ok_or(Error::Mech(pagewise_mech::Error::NoCommand))?;
    let mut sums = Sums::default();
    let mut control_read = false;
    let mut told = std::time::Instant::now();
    loop {
        let shared = SharedBoard::new()?;
        let dup = |f: &std::fs::File, what: &str| {
            f.as_fd()
                .try_clone_to_owned()
                .map_err(|e| io(&format!("duplicating the {what} pipe"), e))
        };
        let (c_fd, s_fd) = (dup(ctl, "control")?, dup(st, "status")?);
        let req = ResetRequest::new(
            opts.input_fd,
            c_fd.as_raw_fd(),
            s_fd.as_raw_fd(),
            shared.fd.as_raw_fd(),
            control_read,
        )
        .with_huge_pages(opts.huge_pages);
        let mut c = std::process::Command::new(first);
        c.args(rest).env("LD_PRELOAD", &preload);
        pagewise_mech::shim::ask(&mut c, &req);
        for fd in [c_fd.as_raw_fd(), s_fd.as_raw_fd(), shared.fd.as_raw_fd()] {
            pagewise_sys::process::keep_fd_across_exec(&mut c, fd);
        }
        pagewise_mech::child::tie(&mut c);
        let mut child = c
            .spawn()
            .map_err(|e| io(&format!("starting {}", first.to_string_lossy()), e))?;
        drop((c_fd, s_fd));
        stats.starts += 1;
        let started = std::time::Instant::now();
        let pidfd = pagewise_sys::process::pidfd_open(child.id() as i32)
            .map_err(|e| io("pidfd_open of the program", e))?;
        let board = shared.board();
        let mut ready = false;
        loop {
            // Waiting for the point in steps of 1 ms, then for the end.
            let wait = if ready { 200 } else { 1 };
            let ended = pagewise_sys::uffd::poll_readable(&[pidfd.as_fd()], wait)
                .map_err(|e| io("waiting for the program", e))?;
            if !ready && board.stage() != stage::STARTING {
                ready = true;
                for w in pending.drain(..) {
                    st.write_all(&w.to_ne_bytes())
                        .map_err(|e| io("writing to afl-fuzz's status descriptor", e))?;
                }
            }
            if ended != 0 {
                break;
            }
            if !ready && started.elapsed() > opts.start_limit {
                let _ = child.kill();
            }
            if told.elapsed() >= STATS_EVERY {
                sums.clone().plus(board).write_stats(stats);
                on_stats(stats);
                told = std::time::Instant::now();
            }
        }
        let status = child.wait().map_err(|e| io("waiting for the program", e))?;
        sums = sums.plus(board);
        sums.write_stats(stats);
        control_read = false;
        match board.stage() {
            stage::STARTING => {
                return Ok(Some(board.refused().unwrap_or_else(|| {
                    if started.elapsed() > opts.start_limit {
                        format!(
                            "the program did not read descriptor {} within {:?}",
                            opts.input_fd, opts.start_limit
                        )
                    } else {
                        format!(
                            "the program ended ({status}) before its first read of descriptor {}",
                            opts.input_fd
                        )
                    }
                })));
            }
            stage::GONE => return Ok(None),
            stage::RUNNING => {
                // Ended during a run: its status is afl-fuzz's answer,
                // told once the next program stands at its point.
                sums.runs += 1;
                if status.signal().is_some_and(|sig| sig != libc::SIGKILL) {
                    sums.killed += 1;
                }
                sums.write_stats(stats);
                pending.push(status.into_raw() as u32);
            }
            stage::OWES_PID => {
                // A reset failed after the control word was read: the
                // next program tells its pid without reading one.
                control_read = true;
                let why = board
                    .ended()
                    .unwrap_or_else(|| format!("the program ended during a reset ({status})"));
                failed(stats, why, on_stats);
            }
            // Killed from outside between runs (afl-fuzz kills the pid
            // it was told as it ends, before it ends pagewise): started
            // again, no reset failed.
            _ if board.ended().is_none() && status.signal().is_some() => {}
            _ => {
                // What a reset inside could not put back: the program
                // is started again, as after a reset that failed.
                let why = board
                    .ended()
                    .unwrap_or_else(|| format!("the program ended between runs ({status})"));
                failed(stats, why, on_stats);
            }
        }
    }
}
