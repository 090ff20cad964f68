//! Resets at fuzzing speed: a [`ResetSession`] holds a process pagewise
//! did not start at one point of its run (its snapshot) and puts it back
//! there as often as asked, each reset costing about what the pages
//! written since cost.
//!
//! The process stays attached for the whole session
//! ([`pagewise_mech::stop::Held`]): a reset interrupts its threads, puts
//! the point back, and lets them run on, with none of a first stop's
//! checks repeated. At each reset:
//!
//! - **Checks, cheap.** The thread count (`/proc/PID/stat`), the layout
//!   (`/proc/PID/maps`, read again from an open descriptor and compared
//!   byte for byte with the point's: any mapping made, removed, moved,
//!   re-protected or renamed shows), the descriptor table (the numbers in
//!   `/proc/PID/fd`; each regular file compared with `kcmp(KCMP_FILE)` to
//!   a duplicate the session holds). Where one differs, the reset takes the
//!   whole path of [`ProcessSnapshots::restore`] (mappings made again,
//!   descriptors closed or opened, alternate signal stacks set) and says
//!   why ([`ResetReport::full`]).
//! - **Registers.** Every thread's registers, `XSAVE` area and signal mask
//!   are written back (three `ptrace` calls each, nothing run inside the
//!   process).
//! - **Memory.** One `PAGEMAP_SCAN` per watched mapping finds the pages
//!   written since; each is written from the point's own table (no table
//!   copied, shared or released: work in proportion to the pages written),
//!   then protected again, but for the pages found written at every reset
//!   lately (a stack, a C library's data): left unprotected, they show as
//!   written at every walk and cost neither a protection nor a fault.
//! - **Descriptors.** The offset of each regular file is set back through
//!   the session's duplicate (which shares it), without a call inside the
//!   process.
//!
//! What the quick path leaves as it is: a thread's alternate signal stack
//! (only its own `sigaltstack` changes it; [`ResetSession::reset_full`]
//! puts it back), and the program break moved within its last page (glibc
//! moves it by whole pages). Signals sent to the process between resets
//! are handed over at the next reset or [`ResetSession::hand_over_signals`] (a caller
//! that waits on the process calls it: a thread stopped by a signal, a crash
//! too, stays stopped until then). A thread caught at the point before it
//! registered its rseq area (just made) would register it again after
//! each reset, which the kernel refuses (the registration is the kernel's,
//! not memory): take the point once threads are past their start. The
//! session holds duplicates of the process's regular files: a `flock`
//! lock it drops by closing one stays held until the session ends.

use super::{us_since, ProcessSnapshots, RestoreOptions};
use crate::{Error, Result, SnapId};
use pagewise_mech::procfs::FdKind;
use pagewise_mech::stop::Held;
pub use pagewise_mech::stop::RunEnd;
use pagewise_mech::Error as MechError;
use serde::Serialize;
use std::io::{Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd};
use std::time::Instant;

/// Where the time of one reset went, microseconds.
#[derive(Debug, Clone, Copy, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ResetPhases {
    /// Interrupting every thread and waiting for it.
    pub stop_us: f64,
    /// The thread count, layout and descriptor checks.
    pub check_us: f64,
    /// The threads' registers (the whole restore, on the full path).
    pub threads_us: f64,
    /// Finding the pages written since (`PAGEMAP_SCAN`).
    pub walk_us: f64,
    /// Writing pages, protecting them again, file offsets.
    pub copy_us: f64,
    /// Letting every thread run on.
    pub resume_us: f64,
}

/// What one reset did.
#[derive(Debug, Clone, Default, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct ResetReport {
    /// Why the whole path of a restore was taken, if it was.
    pub full: Option<String>,
    /// Pages written since the last reset.
    pub pages_dirty: u64,
    /// Pages written back.
    pub pages_written: u64,
    /// Where the time went.
    pub phases: ResetPhases,
    /// Wall time, nanoseconds.
    pub elapsed_ns: u64,
}

/// The process's layout as `/proc/PID/maps` shows it, read again from an
/// open descriptor.
struct MapsWatch {
    file: std::fs::File,
    last: Vec<u8>,
    buf: Vec<u8>,
}

impl MapsWatch {
    fn new(pid: i32) -> Result<Self> {
        let file = std::fs::File::open(format!("/proc/{pid}/maps"))
            .map_err(|e| Error::for_pid(pid, "opening /proc/PID/maps", e))?;
        let mut w = MapsWatch {
            file,
            last: Vec::new(),
            buf: vec![0u8; 64 << 10],
        };
        w.changed(pid)?;
        Ok(w)
    }

    /// Whether the layout differs from the one last read (which it
    /// becomes).
    fn changed(&mut self, pid: i32) -> Result<bool> {
        use std::os::unix::fs::FileExt;
        let mut n = 0;
        loop {
            if n == self.buf.len() {
                self.buf.resize(n * 2, 0);
            }
            let got = self
                .file
                .read_at(&mut self.buf[n..], n as u64)
                .map_err(|e| Error::for_pid(pid, "reading /proc/PID/maps", e))?;
            if got == 0 {
                break;
            }
            n += got;
        }
        let same = self.buf[..n] == self.last[..];
        if !same {
            self.last.clear();
            self.last.extend_from_slice(&self.buf[..n]);
        }
        Ok(!same)
    }
}

/// The process's descriptor table at the point: its numbers, and a
/// duplicate of each regular file with its offset then, put back at each
/// reset unless another process holds that file description too (a
/// shell's output: its offset is that process's as well). A launched
/// program's input is put back always: the fuzzer that shares it writes
/// each input there for the program to read from its start.
struct FdWatch {
    numbers: Vec<i32>,
    files: Vec<WatchedFile>,
}

struct WatchedFile {
    fd: i32,
    dup: std::fs::File,
    pos: u64,
    /// Held by another process too: its offset is left as it is.
    shared: bool,
}

impl FdWatch {
    /// None: what the session holds before a full restore, so that its
    /// duplicates do not count as another holder of the process's files.
    fn none() -> Self {
        FdWatch {
            numbers: Vec::new(),
            files: Vec::new(),
        }
    }

    fn new(
        pid: i32,
        at_point: &[pagewise_mech::procfs::Descriptor],
        input: Option<i32>,
    ) -> Result<Self> {
        let pidfd = pagewise_sys::process::pidfd_open(pid)
            .map_err(|e| Error::for_pid(pid, "pidfd_open", e))?;
        let mut numbers: Vec<i32> = at_point.iter().map(|d| d.fd).collect();
        numbers.sort_unstable();
        let regular: Vec<_> = at_point.iter().filter(|d| d.kind == FdKind::File).collect();
        // Read before the duplicates below are made, which would count.
        let shared = pagewise_mech::procfs::held_elsewhere(pid, &regular, &[]);
        let mut files = Vec::new();
        for d in regular {
            let dup = pagewise_sys::process::pidfd_getfd(pidfd.as_fd(), d.fd).map_err(|e| {
                Error::for_pid(pid, format!("pidfd_getfd of descriptor {}", d.fd), e)
            })?;
            files.push(WatchedFile {
                fd: d.fd,
                dup: std::fs::File::from(dup),
                pos: d.pos,
                shared: shared.contains(&d.fd) && Some(d.fd) != input,
            });
        }
        Ok(FdWatch { numbers, files })
    }

    /// Why the table is no longer the point's, if so.
    fn changed(&self, pid: i32) -> Result<Option<String>> {
        let dir = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map_err(|e| Error::for_pid(pid, "listing /proc/PID/fd", e))?;
        let mut now: Vec<i32> = dir
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        now.sort_unstable();
        if now != self.numbers {
            return Ok(Some("descriptors were opened or closed".into()));
        }
        let me = std::process::id() as i32;
        for WatchedFile { fd, dup, .. } in &self.files {
            let same = pagewise_sys::process::same_open_file(pid, *fd, me, dup.as_raw_fd())
                .map_err(|e| Error::for_pid(pid, format!("kcmp of descriptor {fd}"), e))?;
            if !same {
                return Ok(Some(format!("descriptor {fd} is another file")));
            }
        }
        Ok(None)
    }

    /// Sets every regular file's offset back to the point's, but those
    /// another process holds too.
    fn put_back_offsets(&self, pid: i32) -> Result<()> {
        for WatchedFile { fd, dup, pos, .. } in self.files.iter().filter(|f| !f.shared) {
            let mut f = dup;
            let at = f
                .stream_position()
                .map_err(|e| Error::for_pid(pid, format!("the offset of descriptor {fd}"), e))?;
            if at != *pos {
                f.seek(SeekFrom::Start(*pos)).map_err(|e| {
                    Error::for_pid(pid, format!("setting the offset of descriptor {fd}"), e)
                })?;
            }
        }
        Ok(())
    }
}

/// A process held at a point of its run, put back there at each
/// [`reset`](Self::reset) (see the module).
pub struct ResetSession {
    snaps: ProcessSnapshots,
    held: Held,
    /// The thread that opened it, the only one `ptrace` answers.
    tracer: i32,
    point: SnapId,
    maps: MapsWatch,
    fds: FdWatch,
    /// The launched program's input descriptor, put back even when shared.
    input: Option<i32>,
    /// Started by the session ([`ResetSession::launch`]): killed with it.
    launched: bool,
}

impl std::fmt::Debug for ResetSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResetSession")
            .field("pid", &self.snaps.pid)
            .field("point", &self.point)
            .finish_non_exhaustive()
    }
}

impl ResetSession {
    /// Holds process `pid` and takes its point now (the process stopped
    /// for it, then let run on). Refused where nothing can be done inside
    /// the process (a seccomp filter that cannot be stepped around,
    /// another tracer): a reset puts registers back.
    pub fn open(pid: i32) -> Result<Self> {
        Self::open_with(pid, None)
    }

    fn open_with(pid: i32, input: Option<i32>) -> Result<Self> {
        let mut snaps = ProcessSnapshots::open(pid)?;
        if let Some(why) = snaps.note().or(snaps.untracked()) {
            return Err(super::RollbackRefusal::MemoryOnly {
                pid,
                why: format!("a reset session puts registers back: {why}"),
            }
            .into());
        }
        let mut held = Held::new(pid)?;
        let stopped = held.stopped().ok_or(MechError::ProcessExited(pid))?;
        let point = snaps.take_held(stopped)?;
        let maps = MapsWatch::new(pid)?;
        let fds = FdWatch::new(pid, snaps.snap(point)?.fds.as_deref().unwrap_or(&[]), input)?;
        held.resume(false)?;
        Ok(ResetSession {
            snaps,
            held,
            tracer: pagewise_sys::process::gettid(),
            point,
            maps,
            fds,
            input,
            launched: false,
        })
    }

    /// Starts `argv` and holds it at its first `read` of descriptor `fd`,
    /// about to read (see [`pagewise_mech::stop::launch`]): each
    /// [`reset`](Self::reset) makes the program read its input afresh, and
    /// [`wait_end`](Self::wait_end) sees the run end (`exit_group`, or a
    /// signal that would end it) with the process whole. Descriptors in
    /// `close` are not passed to the program. `limit` bounds its start.
    /// The program is killed when the session is dropped.
    pub fn launch(
        argv: &[std::ffi::OsString],
        fd: std::os::fd::RawFd,
        close: &[std::os::fd::RawFd],
        limit: std::time::Duration,
    ) -> Result<Self> {
        let l = pagewise_mech::stop::launch::start_before_read(argv, fd, close, limit)?;
        pagewise_sys::process::report_seccomp_stops(l.pid, true);
        let opened = Self::open_with(l.pid, Some(fd)).and_then(|mut s| {
            s.launched = true;
            s.point_reads(l.pid, l.read_nr)?;
            Ok(s)
        });
        if opened.is_err() {
            end_launched(l.pid);
        }
        opened
    }

    /// The point of a launched program holds it parked in `pause`: its
    /// recorded call becomes the `read` it was about to make.
    fn point_reads(&mut self, tid: i32, read_nr: i64) -> Result<()> {
        let pid = self.pid();
        let snap = self
            .snaps
            .snaps
            .get_mut(&self.point)
            .ok_or(Error::NoSnapshot { id: self.point })?;
        let t = snap.threads.iter_mut().find(|t| t.tid == tid);
        match t {
            Some(t) if t.rewound == Some(libc::SYS_pause) => {
                t.regs.rax = read_nr as u64;
                t.rewound = Some(read_nr);
                Ok(())
            }
            _ => Err(Error::for_pid(
                pid,
                "finding the launched program parked in pause at its point",
                std::io::Error::from_raw_os_error(libc::ESRCH),
            )),
        }
    }

    /// While it runs after a [`reset`](Self::reset): waits for the run to
    /// end, at most until `deadline` (see [`Held::wait_end`]). After
    /// [`RunEnd::Exit`] or [`RunEnd::Signal`] the process is whole and the
    /// next reset puts it back; after [`RunEnd::Ended`] it is gone.
    pub fn wait_end(&mut self, deadline: Option<Instant>) -> Result<RunEnd> {
        self.same_thread()?;
        Ok(self.held.wait_end(deadline)?)
    }

    /// The process.
    pub fn pid(&self) -> i32 {
        self.snaps.pid
    }

    /// The point's snapshot, for reading it ([`ProcessSnapshots::read`]
    /// and the rest).
    pub fn snapshots(&self) -> &ProcessSnapshots {
        &self.snaps
    }

    /// The point's id among [`snapshots`](Self::snapshots).
    pub fn point(&self) -> SnapId {
        self.point
    }

    /// Puts the process back at its point (see the module).
    pub fn reset(&mut self) -> Result<ResetReport> {
        self.reset_with(false)
    }

    /// As [`reset`](Self::reset), always by the whole path of a restore
    /// (the alternate signal stacks too).
    pub fn reset_full(&mut self) -> Result<ResetReport> {
        self.reset_with(true)
    }

    /// Hands over the signals sent to the process since it was let run
    /// (see [`Held::hand_over_signals`]); how many. A caller that waits for the process
    /// between resets calls it now and then.
    pub fn hand_over_signals(&mut self) -> Result<usize> {
        self.same_thread()?;
        Ok(self.held.hand_over_signals()?)
    }

    /// Refuses a call from another thread than the one that opened the
    /// session (`ptrace` would answer it as if the process were gone).
    fn same_thread(&self) -> Result<()> {
        let me = pagewise_sys::process::gettid();
        if me == self.tracer {
            return Ok(());
        }
        Err(Error::for_pid(
            self.pid(),
            format!(
                "a reset session used from thread {me}, not from thread {} that opened it \
                 (ptrace belongs to a thread)",
                self.tracer
            ),
            std::io::Error::from_raw_os_error(libc::EPERM),
        ))
    }

    fn reset_with(&mut self, full: bool) -> Result<ResetReport> {
        self.same_thread()?;
        let r = self.reset_stopped(full);
        let r = self.snaps.gone_or(r);
        // Running again whatever happened; the registers set only if it
        // went through.
        let t = Instant::now();
        let resumed = self.held.resume(r.is_ok());
        let mut rep = r?;
        resumed?;
        let mut lap = t;
        rep.phases.resume_us = us_since(&mut lap);
        rep.elapsed_ns += t.elapsed().as_nanos() as u64;
        Ok(rep)
    }

    fn reset_stopped(&mut self, full: bool) -> Result<ResetReport> {
        let t0 = Instant::now();
        let mut lap = t0;
        let pid = self.pid();
        let mut rep = ResetReport::default();
        let same_threads = self.held.stop()?;
        rep.phases.stop_us = us_since(&mut lap);
        let why = if full {
            Some("asked".to_string())
        } else if !same_threads {
            Some("threads were made".to_string())
        } else if self.maps.changed(pid)? {
            Some("the layout changed".to_string())
        } else if self.snaps.current_is != Some(self.point) {
            Some("memory is not the point's".to_string())
        } else {
            self.fds.changed(pid)?
        };
        rep.phases.check_us = us_since(&mut lap);
        match why {
            Some(why) => {
                if !same_threads {
                    // Held too, the threads made since: the restore then
                    // says which.
                    self.held.hold_new_threads()?;
                }
                let stopped = self.held.stopped().ok_or(MechError::ProcessExited(pid))?;
                self.fds = FdWatch::none();
                let r =
                    self.snaps
                        .restore_held(self.point, RestoreOptions::default(), stopped, &[])?;
                self.maps.changed(pid)?;
                let point = self.snaps.snap(self.point)?;
                self.fds = FdWatch::new(pid, point.fds.as_deref().unwrap_or(&[]), self.input)?;
                // The restore left a shared input's offset; it is the
                // program's input, put back as on the quick path.
                self.fds.put_back_offsets(pid)?;
                rep.full = Some(why);
                rep.pages_dirty = r.stats.pages_dirty;
                rep.pages_written = r.stats.pages_written;
                rep.phases.threads_us = us_since(&mut lap);
                rep.phases.walk_us = r.phases.walk_us;
            }
            None => {
                let snap = self.snaps.snap(self.point)?;
                super::threads::put_back_registers(pid, &snap.threads)?;
                rep.phases.threads_us = us_since(&mut lap);
                let mut stats = crate::RestoreStats::default();
                let walk_ns = self.snaps.reset_written(&mut stats)?;
                self.fds.put_back_offsets(pid)?;
                rep.pages_dirty = stats.pages_dirty;
                rep.pages_written = stats.pages_written;
                (rep.phases.walk_us, rep.phases.copy_us) =
                    super::walk_and_copy_us(walk_ns, &mut lap);
            }
        }
        rep.elapsed_ns = t0.elapsed().as_nanos() as u64;
        Ok(rep)
    }
}

/// Kills a program the session started, and reaps it.
fn end_launched(pid: i32) {
    let mut tids = pagewise_mech::procfs::tasks(pid).unwrap_or_default();
    let _ = pagewise_sys::process::kill(pid, libc::SIGKILL);
    // Its other threads first (each reaped by its tracer), the process
    // last.
    tids.retain(|&t| t != pid);
    tids.push(pid);
    for t in tids {
        let _ = pagewise_sys::launch::wait_raw(t, libc::__WALL);
    }
    pagewise_sys::process::report_seccomp_stops(pid, false);
}

impl Drop for ResetSession {
    /// A program the session started ends with it.
    fn drop(&mut self) {
        if self.launched {
            end_launched(self.pid());
        }
    }
}
