//! `pagewise snapshot serve`: a handle on a running process held for
//! repeated rollbacks, driven by one line per request on stdin and one
//! JSON line per answer on stdout, so that a fuzzer or a model checker in
//! any language can take snapshots of its target and reset it.

use anyhow::Result;
use pagewise::snap::{ProcessSnapshots, RestoreOptions, SnapId};
use std::io::{BufRead, Write};
use std::sync::{Arc, Mutex};

/// `snapshot serve`: one JSON line a request, and one first.
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
// Built once per answer and printed at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ServeLine {
    /// First: the process held, and what pagewise says of it.
    Serving {
        /// The process.
        serving: i32,
        /// A note on how it is held (null when none).
        note: Option<String>,
    },
    /// A snapshot taken.
    Take {
        /// It.
        take: Taken,
    },
    /// A snapshot put back.
    Restore {
        /// It.
        restore: Restored,
    },
    /// With `--session`: the process put back at its point.
    Reset {
        /// What the reset did.
        reset: pagewise::snap::ResetReport,
    },
    /// A snapshot forgotten.
    Dropped {
        /// Its id.
        dropped: SnapId,
    },
    /// The snapshots held, oldest first.
    Snapshots {
        /// Their ids.
        snapshots: Vec<SnapId>,
    },
    /// A snapshot saved into a store.
    Saved {
        /// It.
        saved: Saved,
    },
    /// A request that failed; the next is read.
    Error {
        /// What failed, as a sentence.
        error: String,
        /// Its class (`bad-input`, `unsupported`, `permission`, `gone`,
        /// `busy`, `failed`).
        class: &'static str,
    },
}
impl crate::json::Printed for ServeLine {}

/// A snapshot taken by `snapshot serve`.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Taken {
    /// Its id.
    pub id: SnapId,
    /// What taking it cost.
    pub stats: pagewise::snap::TakeStats,
}

/// A snapshot put back by `snapshot serve`.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Restored {
    /// Its id.
    pub id: SnapId,
    /// What was put back.
    pub report: pagewise::snap::RestoreReport,
}

/// A snapshot saved by `snapshot serve`.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Saved {
    /// Its id in the process.
    pub id: SnapId,
    /// The store.
    pub store: std::path::PathBuf,
    /// What saving it wrote.
    pub stats: pagewise::snap::SaveStats,
}

/// `snapshot restore --json`: one process's restore (`--pid`), or a
/// group's (`--container`, `--cgroup`).
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum RestoreOutput<'a> {
    /// `--pid`.
    One {
        /// The snapshot put back.
        restored: Box<RestoredFromStore>,
    },
    /// `--container`, `--cgroup`: what was put back into each process of
    /// the group, in pid order.
    Group {
        /// Each process.
        restored: &'a [pagewise::snap::process::group::MemberRestore],
    },
    /// `--criu`: a CRIU dump put in place.
    Criu {
        /// The dump's directory.
        criu: std::path::PathBuf,
        /// What was put in place.
        restored: pagewise::snap::criu::InPlace,
    },
}
impl crate::json::Printed for RestoreOutput<'_> {}

/// A snapshot of a store put back into a process.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct RestoredFromStore {
    /// The store.
    pub store: std::path::PathBuf,
    /// The snapshot's id in the store.
    pub id: u64,
    /// The process.
    pub pid: i32,
    /// What was put back.
    pub report: pagewise::snap::RestoreReport,
}

/// `snapshot extract --json`.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct ExtractOutput {
    /// What was written.
    pub extracted: Extracted,
}
impl crate::json::Printed for ExtractOutput {}

/// A snapshot's memory written to a file.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Extracted {
    /// The snapshot's id in the store.
    pub id: u64,
    /// The file written.
    pub out: std::path::PathBuf,
    /// Bytes of memory written.
    pub bytes: u64,
    /// Whether it is an ELF core file.
    pub core: bool,
    /// Where each region's bytes are in a raw file (empty for a core).
    pub regions: Vec<pagewise::snap::extract::Placed>,
}

/// What `snapshot serve` says about itself in `--help`.
pub const SERVE_HELP: &str = "\
Requests, one per line on stdin; one JSON line answers each on stdout:
  take                  snapshot the process now: {\"take\":{\"id\":N,...}}
  restore [N]           put snapshot N (default: the last taken) back
  restore-memory [N]    the same, memory and layout only (not registers)
  drop N                forget snapshot N
  list                  the snapshots held
  save N DIR [LABEL]    save snapshot N into the store DIR (created if
                        missing), with its layout and threads
  quit                  end (as end of input does)
With --session: the point is taken at once, and
  reset                 put the process back at its point: {\"reset\":{...}}
A request that fails answers {\"error\":...,\"class\":...} and the next is
read; a process that ended ends the command (exit status 5).

What a restore puts back: every page of every private writable mapping,
the layout (mappings made, removed, moved, grown, shrunk or re-protected
since, and the program break), every thread's registers, signal mask
and alternate signal stack, and the descriptor table: descriptors opened
since are closed (a client that connected since sees its connection end),
files closed since are opened again, files' offsets put back; a restore
is refused where a descriptor the snapshot had is gone for good (a
socket, a pipe), naming each. Not put back: the files themselves, shared
memory, pending signals. The process is stopped for each take and
restore, and left as it was found otherwise.";

#[derive(clap::Args)]
pub struct ServeArgs {
    /// The process to hold.
    #[arg(long)]
    pid: i32,
    /// A reset session: the process is held attached from now on, its
    /// point taken at once (answered as a take), and each `reset` puts it
    /// back there at fuzzing speed (only the pages written since, nothing
    /// repeated of a first stop; the whole restore where the layout, the
    /// descriptors or the threads changed, saying why). Requests: reset,
    /// list, save and quit.
    #[arg(long)]
    session: bool,
    #[command(flatten)]
    fds: FdArgs,
}

/// What a restore does with descriptors, as the user asks.
#[derive(clap::Args, Clone, Copy)]
pub struct FdArgs {
    /// Leave open the descriptors opened since the snapshot (by default
    /// they are closed inside the process: a client that connected since
    /// sees its connection end, and the program's memory, put back, no
    /// longer knows them).
    #[arg(long)]
    keep_new_fds: bool,
    /// Restore even where descriptors the snapshot had are gone for good
    /// (a socket or pipe closed since, a file deleted): they stay closed.
    #[arg(long)]
    ignore_missing_fds: bool,
}

impl FdArgs {
    fn options(self, memory_only: bool) -> RestoreOptions {
        RestoreOptions::default()
            .memory_only(memory_only)
            .keep_new_fds(self.keep_new_fds)
            .ignore_missing_fds(self.ignore_missing_fds)
    }
}

/// One request, as read.
enum Request {
    Take,
    Restore(Option<SnapId>, bool),
    Drop(SnapId),
    List,
    Save(SnapId, std::path::PathBuf, String),
    Quit,
}

fn parse(line: &str) -> std::result::Result<Request, String> {
    let mut w = line.split_whitespace();
    let id = |s: Option<&str>| -> std::result::Result<Option<SnapId>, String> {
        s.map(|v| v.parse().map_err(|_| format!("{v:?} is not a snapshot id")))
            .transpose()
    };
    let req = match w.next() {
        Some("take") => Request::Take,
        Some("restore") => Request::Restore(id(w.next())?, false),
        Some("restore-memory") => Request::Restore(id(w.next())?, true),
        Some("drop") => Request::Drop(id(w.next())?.ok_or("drop needs a snapshot id")?),
        Some("list") => Request::List,
        Some("save") => {
            let id = id(w.next())?.ok_or("save needs a snapshot id and a directory")?;
            let dir = w.next().ok_or("save needs a directory")?;
            let label = w.by_ref().collect::<Vec<_>>().join(" ");
            return Ok(Request::Save(id, dir.into(), label));
        }
        Some("quit") | None => Request::Quit,
        Some(other) => return Err(format!("unknown request {other:?} (see --help)")),
    };
    match w.next() {
        Some(extra) => Err(format!("unexpected {extra:?} after the request")),
        None => Ok(req),
    }
}

pub(crate) fn class_name(e: &impl pagewise::Failure) -> &'static str {
    match e.class() {
        pagewise::ErrorClass::BadInput => "bad-input",
        pagewise::ErrorClass::Unsupported => "unsupported",
        pagewise::ErrorClass::Permission => "permission",
        pagewise::ErrorClass::Gone => "gone",
        pagewise::ErrorClass::Busy => "busy",
        _ => "failed",
    }
}

pub fn serve(a: ServeArgs) -> Result<i32> {
    if a.session {
        return crate::serve_session::serve(a.pid);
    }
    let handle = ProcessSnapshots::open(a.pid)?;
    // SIGINT and SIGTERM end the command between requests, never inside a
    // take or a restore (the lock is held for each).
    let busy = Arc::new(Mutex::new(()));
    {
        let busy = busy.clone();
        pagewise::agent::stop::on_stop_otherwise(move |_| {
            let _held = busy.lock();
            // Exiting closes the userfaultfd: nothing stays registered in
            // the process.
            std::process::exit(0);
        })?;
    }
    let mut h = handle;
    let mut out = std::io::stdout().lock();
    let hello = ServeLine::Serving {
        serving: a.pid,
        note: h.note().or(h.untracked()).map(str::to_string),
    };
    writeln!(out, "{}", crate::json::line(&hello)?)?;
    out.flush()?;
    let mut last: Option<SnapId> = None;
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let req = match parse(&line) {
            Ok(r) => r,
            Err(why) => {
                let e = ServeLine::Error {
                    error: why.to_string(),
                    class: "bad-input",
                };
                writeln!(out, "{}", crate::json::line(&e)?)?;
                out.flush()?;
                continue;
            }
        };
        let answer = {
            let _held = busy.lock().unwrap_or_else(|e| e.into_inner());
            match req {
                Request::Quit => break,
                Request::Take => h.take().and_then(|id| {
                    last = Some(id);
                    Ok(ServeLine::Take {
                        take: Taken {
                            id,
                            stats: h.take_stats(id)?,
                        },
                    })
                }),
                Request::Restore(id, memory_only) => match id.or(last) {
                    None => Err(pagewise::snap::Error::NoneTaken),
                    Some(id) => {
                        h.restore(id, a.fds.options(memory_only))
                            .map(|report| ServeLine::Restore {
                                restore: Restored { id, report },
                            })
                    }
                },
                Request::Drop(id) => h.drop_snapshot(id).map(|()| {
                    if last == Some(id) {
                        last = h.ids().last().copied();
                    }
                    ServeLine::Dropped { dropped: id }
                }),
                Request::List => Ok(ServeLine::Snapshots { snapshots: h.ids() }),
                Request::Save(id, dir, label) => pagewise::snap::DiskStore::create(&dir, true)
                    .and_then(|mut d| h.save(id, &mut d, &label))
                    .map(|stats| ServeLine::Saved {
                        saved: Saved {
                            id,
                            store: dir,
                            stats,
                        },
                    }),
            }
        };
        match answer {
            Ok(v) => writeln!(out, "{}", crate::json::line(&v)?)?,
            Err(e) => {
                let gone = e.class() == pagewise::ErrorClass::Gone;
                let v = ServeLine::Error {
                    error: e.to_string(),
                    class: class_name(&e),
                };
                writeln!(out, "{}", crate::json::line(&v)?)?;
                out.flush()?;
                if gone {
                    return Err(e.into());
                }
            }
        }
        out.flush()?;
    }
    Ok(0)
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    /// The store directory (with --criu: the CRIU dump's images).
    dir: std::path::PathBuf,
    /// The snapshot of the store to put back (default: its last).
    id: Option<u64>,
    /// DIR holds a CRIU dump (`criu dump -D DIR`, `pagewise criu export`):
    /// put its memory into the running process --pid in place, writing
    /// only the pages that differ (for instance a process `criu restore`
    /// started from an earlier dump of it, rolled to a later one). The
    /// dump's private mappings must be the process's; registers are not
    /// put back (the mapping each thread's stack pointer is in is left as
    /// it is).
    #[arg(long, conflicts_with_all = ["id", "memory_only", "another_process"])]
    criu: bool,
    /// With --criu: the dump's task to read (its `pagemap-ID.img`;
    /// default: the --pid, or the dump's only task).
    #[arg(long, requires = "criu")]
    task: Option<u32>,
    /// The process to put it back into: the one it was taken of.
    #[arg(long, required_unless_present_any = ["containers", "cgroups"])]
    pid: Option<i32>,
    /// Instead of --pid: every process of a container or cgroup, each put
    /// back from its own snapshot in the store (the last of its pid at or
    /// before the id given), all held stopped at one instant, with the
    /// memory they share: a group taken by `snapshot --container`.
    #[command(flatten)]
    groups: crate::groups::Groups,
    /// Put back memory (and the layout where calls can be made inside the
    /// process) only, not the threads' registers: for a snapshot without
    /// them (store format 2), a process whose threads changed since, or one
    /// nothing can be done inside (seccomp filters that refuse the calls,
    /// respected with --respect-seccomp). The threads run on
    /// from where they are, so the memory they run on is left as it is: the
    /// mapping each thread's stack pointer is in and the one holding its
    /// thread-control block and thread-local data (the output says how
    /// many); descriptors are put back where calls can be made inside.
    #[arg(long)]
    memory_only: bool,
    /// Restore a snapshot taken of another process (or of an earlier
    /// process with the same pid) into this one.
    #[arg(long)]
    another_process: bool,
    #[command(flatten)]
    fds: FdArgs,
    /// One JSON object.
    #[arg(long)]
    json: bool,
}

/// What `snapshot restore` says in `--help`.
pub const RESTORE_HELP: &str = "\
One restore compares the snapshot with what the process's memory holds
now (a page of anonymous memory never populated reads as zeros and is
not read) and writes the pages that differ; for repeated resets, hold the
process with `pagewise snapshot serve --pid P`, which writes only the
pages written since.
Put back: every page of every private writable mapping, the layout and
the program break, every thread's registers, signal mask and alternate
signal stack, and the descriptor table (snapshots of store format 4):
descriptors opened since are closed inside the process, files closed
since are opened again at their path, flags and offset, the offsets of
files open at both times put back; refused, naming each, where a
descriptor the snapshot had is gone for good (a socket, a pipe). Not put
back: the files themselves, shared memory, pending signals.";

pub fn restore(a: RestoreArgs) -> Result<i32> {
    if a.criu {
        return restore_criu(&a);
    }
    let disk = pagewise::snap::DiskStore::open(&a.dir)?;
    let id = match a.id {
        Some(id) => id,
        None => *disk.ids()?.last().ok_or_else(|| {
            crate::exit::Usage(format!("{}: the store holds no snapshot", a.dir.display()))
        })?,
    };
    let pid = match (a.pid, a.groups.given()) {
        (Some(pid), false) => pid,
        (None, true) => return restore_group(&a, &disk, id),
        _ => crate::usage!("give --pid, or --container/--cgroup, not both"),
    };
    // One restore: nothing tracked, what memory holds compared.
    let mut h = ProcessSnapshots::open_for_one_restore(pid)?;
    // Without --memory-only the refusal says it (once).
    if let (Some(note), false, true) = (h.note(), a.json, a.memory_only) {
        eprintln!("pagewise: {note}");
    }
    let sid = h.load(&disk, id, a.another_process)?;
    let r = h.restore(sid, a.fds.options(a.memory_only))?;
    if a.json {
        let v = RestoreOutput::One {
            restored: Box::new(RestoredFromStore {
                store: a.dir.clone(),
                id,
                pid,
                report: r,
            }),
        };
        println!("{}", crate::json::line(&v)?);
    } else {
        println!(
            "restored snapshot {id} of {} into process {}: {} pages written, {} layout calls, registers of {} thread(s), {:.2} ms",
            a.dir.display(),
            pid,
            r.stats.pages_written,
            r.layout_calls,
            r.threads,
            r.stats.elapsed_ns as f64 / 1e6
        );
        if !r.thread_areas.is_empty() {
            println!(
                "memory-only: {} mapping(s) that running threads are on (stacks, thread-control blocks) left as they are",
                r.thread_areas.len()
            );
        }
        for line in fd_lines(&r.fds) {
            println!("{line}");
        }
    }
    Ok(0)
}

/// `snapshot restore --criu DIR --pid P`.
fn restore_criu(a: &RestoreArgs) -> Result<i32> {
    let Some(pid) = a.pid else {
        crate::usage!("--criu puts a dump into one running process: give --pid");
    };
    let r = pagewise::snap::criu::restore_in_place(&a.dir, pid, a.task)?;
    if a.json {
        let v = RestoreOutput::Criu {
            criu: a.dir.clone(),
            restored: r,
        };
        println!("{}", crate::json::line(&v)?);
        return Ok(0);
    }
    println!(
        "put CRIU dump {} (task {}) into process {}: {} of {} pages differed and were written, {} left-out pages reset, {} thread(s) put back, {:.2} ms",
        a.dir.display(),
        r.task,
        pid,
        r.pages_written,
        r.pages_compared,
        r.pages_reset,
        r.threads,
        r.elapsed_ns as f64 / 1e6
    );
    Ok(0)
}

/// `snapshot restore --container/--cgroup`: each process of the group
/// put back from the last snapshot of its pid at or before `id`.
fn restore_group(a: &RestoreArgs, disk: &pagewise::snap::DiskStore, id: u64) -> Result<i32> {
    let mut pids = Vec::new();
    a.groups.add_to(&mut pids)?;
    let list = disk.list()?;
    let mut members = Vec::new();
    for &pid in &pids {
        let Some(s) = list.iter().rev().find(|s| s.id <= id && s.pid == Some(pid)) else {
            crate::usage!(
                "{}: no snapshot of process {pid} at or before {id} (it joined the group since?)",
                a.dir.display()
            );
        };
        members.push((pid, s.id));
    }
    let done = pagewise::snap::process::group::restore_group(
        disk,
        &members,
        a.fds.options(a.memory_only),
    )?;
    if a.json {
        println!(
            "{}",
            crate::json::line(&RestoreOutput::Group { restored: &done })?
        );
        return Ok(0);
    }
    for m in &done {
        println!(
            "restored snapshot {} into process {}: {} pages written ({} shared), {} layout calls, registers of {} thread(s)",
            m.id,
            m.pid,
            m.report.stats.pages_written,
            m.shared_pages,
            m.report.layout_calls,
            m.report.threads
        );
    }
    println!(
        "{} processes put back at one instant from {}",
        done.len(),
        a.dir.display()
    );
    Ok(0)
}

/// What a restore did with descriptors, a line per kind of change.
fn fd_lines(r: &pagewise::snap::fds::FdReport) -> Vec<String> {
    let list = |v: &[pagewise::snap::fds::FdNote]| {
        v.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !r.recorded {
        return vec![
            "descriptors: not recorded in this snapshot (a store of format 3 or older): left as they are".into(),
        ];
    }
    let mut out = Vec::new();
    let said = if r.applied {
        ""
    } else {
        " (nothing can be done inside the process: left as they are)"
    };
    for (what, v) in [
        ("closed (opened since)", &r.closed),
        ("left open (opened since)", &r.kept),
        ("opened again (closed since)", &r.reopened),
        ("offset put back", &r.rewound),
        ("offset left (another process holds it too)", &r.shared),
        ("gone, left closed", &r.missing),
    ] {
        if !v.is_empty() {
            out.push(format!("descriptors {what}{said}: {}", list(v)));
        }
    }
    if out.is_empty() {
        out.push("descriptors: as in the snapshot".into());
    }
    out
}

#[derive(clap::Args)]
pub struct ExtractArgs {
    /// The store directory.
    dir: std::path::PathBuf,
    /// The snapshot.
    id: u64,
    /// Where to write its pages.
    #[arg(long)]
    out: std::path::PathBuf,
    /// Only the addresses A to B (hexadecimal, page-aligned, inside the
    /// snapshot's regions), instead of every region one after the other.
    #[arg(long, value_name = "A-B", conflicts_with = "core")]
    range: Option<String>,
    /// An ELF core file (`gdb PROGRAM FILE` reads it: a segment per
    /// region, each thread's registers) instead of raw bytes.
    #[arg(long)]
    core: bool,
    /// One JSON object: the regions and where each begins in the file.
    #[arg(long)]
    json: bool,
}

fn parse_range(s: &str) -> Result<(u64, u64)> {
    let bad = || crate::exit::Usage(format!("--range {s}: give START-END in hexadecimal"));
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let hex = |v: &str| u64::from_str_radix(v.trim_start_matches("0x"), 16).map_err(|_| bad());
    Ok((hex(a)?, hex(b)?))
}

pub fn extract(a: ExtractArgs) -> Result<i32> {
    use std::io::Write as _;
    let disk = pagewise::snap::DiskStore::open(&a.dir)?;
    let snap = disk.load(a.id)?;
    let range = a.range.as_deref().map(parse_range).transpose()?;
    // Owner-only (it holds process memory), never through a planted link.
    let file = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&a.out)
            .map_err(|e| anyhow::anyhow!("creating {}: {e}", a.out.display()))?
    };
    let mut out = std::io::BufWriter::new(file);
    let (bytes, placed) = if a.core {
        (
            pagewise::snap::extract::core(&disk, &snap, &mut out)?,
            Vec::new(),
        )
    } else {
        let placed = match pagewise::snap::extract::raw(&disk, &snap, range, &mut out) {
            Err(e) if e.class() == pagewise::ErrorClass::BadInput || e.errno() == libc::EFAULT => {
                return Err(crate::exit::Usage(format!("--range: {e}")).into())
            }
            r => r?,
        };
        (placed.iter().map(|p| p.end - p.start).sum(), placed)
    };
    out.flush()?;
    if a.json {
        let v = ExtractOutput {
            extracted: Extracted {
                id: a.id,
                out: a.out.clone(),
                bytes,
                core: a.core,
                regions: placed,
            },
        };
        println!("{}", crate::json::line(&v)?);
    } else {
        println!(
            "wrote {} bytes of snapshot {} to {}",
            bytes,
            a.id,
            a.out.display()
        );
    }
    Ok(0)
}
