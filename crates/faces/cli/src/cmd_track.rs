//! `pagewise track`.

use crate::stop::Stop;
use anyhow::{bail, Context, Result};
use pagewise::agent::child;
use pagewise::process::Member;
use pagewise::track::{protocol, BackendKind, Collection, DirtyTracker};
use pagewise::track::{start_tracked, Tracked};
use pagewise::PAGE_SIZE;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(
    after_help = "Examples:\n  pagewise track --pid 1234 --interval-ms 500 --count 10\n  pagewise track --json --interval-ms 1000 -- redis-server --port 7000\n\nJSON lines carry t_ms, dirty_pages, dirty_bytes, ranges ([start_address, page_count] pairs), range_count, dirty_rate_bytes_per_s, collect_ns, pages_scanned, backend and pid; regions ([start_address, length] pairs) on the first line and when they change, where known."
)]
pub struct Args {
    /// Process to watch from outside (uffd-wp, soft-dirty or hash).
    #[arg(long, conflicts_with = "cmd")]
    pid: Option<i32>,
    /// Instead of --pid: every process of a container or cgroup, each
    /// tracked from outside, followed as processes come and go (a line per
    /// process and collection; JSON lines carry ns_pid and container).
    #[command(flatten)]
    groups: crate::groups::Groups,
    /// Milliseconds between collections.
    #[arg(long = "interval-ms", alias = "interval", value_name = "MS", default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    interval: u64,
    /// Stop after this many collections (default: until the process exits or Ctrl-C).
    #[arg(long)]
    count: Option<u64>,
    /// uffd-wp, soft-dirty, mprotect, hash or auto.
    #[arg(long, default_value = "auto")]
    backend: BackendKind,
    /// One JSON object per collection, one per line.
    #[arg(long)]
    json: bool,
    /// Command to start and track.
    #[arg(last = true)]
    cmd: Vec<String>,
}

/// Where collections come from.
enum Source {
    Outside(DirtyTracker, i32),
    Shim(UnixStream, BackendKind),
}

impl Source {
    fn backend(&self) -> BackendKind {
        match self {
            Source::Outside(t, _) => t.backend(),
            Source::Shim(_, b) => *b,
        }
    }
    /// The regions tracked, `[start, length]` (none known through the shim).
    fn regions(&self) -> Vec<[u64; 2]> {
        match self {
            Source::Outside(t, _) => t.regions().iter().map(|r| [r.start, r.len]).collect(),
            Source::Shim(..) => Vec::new(),
        }
    }

    /// The collection the shim sent unasked as its program exited, if it
    /// did (read within 1 s: a grandchild may hold the socket open).
    fn last(&mut self) -> Option<Collection> {
        match self {
            Source::Outside(..) => None,
            Source::Shim(s, _) => {
                s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
                protocol::read_collection(s).ok()
            }
        }
    }

    fn collect(&mut self) -> pagewise::track::Result<Collection> {
        match self {
            Source::Outside(t, pid) => {
                t.sync_process_mappings(Some(*pid), false)?;
                for (r, why) in t.take_untracked() {
                    eprintln!(
                        "pagewise: {:#x}..{:#x} of process {pid} is not tracked: {why}",
                        r.start,
                        r.end()
                    );
                }
                // A note that comes during the run (the process made a
                // userfaultfd of its own) is said when it comes.
                let before = t.note().map(str::to_owned);
                let c = t.collect();
                if let Some(n) = t.note().filter(|&n| before.as_deref() != Some(n)) {
                    eprintln!("pagewise: pid {pid}: {n}");
                }
                c
            }
            Source::Shim(s, _) => protocol::collect(s).map_err(|e| {
                pagewise::MechError::os("collecting through the preload shim", e).into()
            }),
        }
    }
}

/// The program a silent shim left behind runs on under the same pid:
/// watched from outside, said once; stopped if that fails too.
fn watch_from_outside(
    mut child: std::process::Child,
    why: pagewise::track::Error,
    a: &Args,
) -> Result<(std::process::Child, Source)> {
    let pid = child.id() as i32;
    match DirtyTracker::for_process(pid, a.backend) {
        Ok(t) => {
            eprintln!(
                "pagewise: the preload shim in {} did not answer (a wrapper that replaced \
                 itself with exec?): tracking pid {pid} from outside",
                a.cmd[0]
            );
            // Why `auto` fell back, on stderr with --json too.
            if let Some(n) = t.note() {
                eprintln!("pagewise: {n}");
            }
            Ok((child, Source::Outside(t, pid)))
        }
        Err(outside) => {
            pagewise::agent::child::stop(&mut child, Duration::from_secs(5));
            Err(anyhow::Error::new(why)
                .context(format!("watching it from outside failed too: {outside}")))
        }
    }
}

/// What `track` watches: a process (and the command's child, if it
/// started one), or the status of a command that ended before tracking
/// began.
enum Watched {
    Tracking(Option<std::process::Child>, Source, i32),
    Over(i32),
}

/// Starts the command (if any) and the tracking of the process.
fn watch(a: &Args) -> Result<Watched> {
    Ok(match (a.pid, a.cmd.is_empty()) {
        (Some(pid), true) => {
            let t = DirtyTracker::for_process(pid, a.backend)?;
            // Why `auto` fell back, on stderr with --json too.
            if let Some(n) = t.note() {
                eprintln!("pagewise: {n}");
            }
            Watched::Tracking(None, Source::Outside(t, pid), pid)
        }
        (None, false) => {
            let inside = match a.backend {
                BackendKind::UffdWp => true,
                BackendKind::Auto => BackendKind::UffdWp.available_in_process().is_ok(),
                _ => false,
            };
            if inside {
                BackendKind::UffdWp.available_in_process().map_err(|why| {
                    pagewise::Error::from(pagewise::MechError::Unsupported {
                        feature: "uffd-wp",
                        why,
                    })
                })?;
                let setup = |c: &mut Command| crate::stop::program_output(c, a.json);
                let (child, src) = match start_tracked(&a.cmd, BackendKind::UffdWp, setup)? {
                    Tracked::Running(child, sock, backend) => (child, Source::Shim(sock, backend)),
                    // A wrapper that exec'd the real program (a pyenv shim)
                    // leaves the shim's socket behind.
                    Tracked::Silent(child, why) => watch_from_outside(child, why, a)?,
                    Tracked::Over(st) => {
                        if !a.json {
                            eprintln!("pagewise: {} exited ({st}) before tracking began", a.cmd[0]);
                        }
                        return Ok(Watched::Over(child::exit_code(st)));
                    }
                    _ => bail!("{}: the shim answered as this tool does not know", a.cmd[0]),
                };
                let pid = child.id() as i32;
                Watched::Tracking(Some(child), src, pid)
            } else {
                a.backend.available_for_pid().map_err(|why| {
                    pagewise::Error::from(pagewise::MechError::Unsupported {
                        feature: a.backend.name(),
                        why,
                    })
                })?;
                let mut c = Command::new(&a.cmd[0]);
                c.args(&a.cmd[1..]);
                child::tie(&mut c);
                crate::stop::program_output(&mut c, a.json);
                let child = c
                    .spawn()
                    .with_context(|| format!("starting {}", a.cmd[0]))?;
                let pid = child.id() as i32;
                let t = DirtyTracker::for_process(pid, a.backend)?;
                Watched::Tracking(Some(child), Source::Outside(t, pid), pid)
            }
        }
        (None, true) => crate::usage!("say which process: --pid PID, or -- CMD ARGS"),
        (Some(_), false) => crate::usage!("--pid and a command exclude each other"),
    })
}

pub fn run(a: Args) -> Result<i32> {
    let stop = Stop::take()?;
    if a.groups.given() {
        if a.pid.is_some() || !a.cmd.is_empty() {
            crate::usage!("--container and --cgroup take the place of --pid and of a command");
        }
        return run_group(&a, &stop);
    }
    let (mut child, mut source, pid) = match watch(&a)? {
        Watched::Tracking(child, source, pid) => (child, source, pid),
        Watched::Over(code) => return Ok(code),
    };
    let backend = source.backend();
    if !a.json {
        eprintln!(
            "pagewise: tracking pid {pid} with {backend} every {} ms",
            a.interval
        );
    }
    let t0 = Instant::now();
    let mut n = 0u64;
    let mut next = Instant::now();
    let mut regions: Vec<[u64; 2]> = Vec::new();
    loop {
        if a.count.is_some_and(|c| n >= c) {
            break;
        }
        next += Duration::from_millis(a.interval);
        if stop.sleep(next.saturating_duration_since(Instant::now())) {
            break;
        }
        // The command ended: its last collection, where its shim sent one
        // at its exit, then its status.
        let ended = |st: std::process::ExitStatus,
                     source: &mut Source,
                     n: &mut u64,
                     regions: &mut Vec<[u64; 2]>|
         -> Result<i32> {
            if let Some(c) = source.last() {
                *n += 1;
                print(&a, (pid, None), backend, t0, &c, source.regions(), regions)?;
            }
            let n = *n;
            if !a.json {
                eprintln!("pagewise: {} exited ({st}) after {n} collections", a.cmd[0]);
            }
            Ok(child::exit_code(st))
        };
        if let Some(c) = child.as_mut() {
            if let Some(st) = c.try_wait()? {
                return ended(st, &mut source, &mut n, &mut regions);
            }
        }
        let c = match source.collect() {
            Ok(c) => c,
            Err(e) => {
                if let Some(ch) = child.as_mut() {
                    // A collection fails as the command exits: give it a
                    // moment to be reaped, and report its status.
                    if let Some(st) = child::wait_for(ch, Duration::from_secs(2)) {
                        return ended(st, &mut source, &mut n, &mut regions);
                    }
                }
                // ESRCH: its memory is gone already, though it may not be
                // reaped yet (a zombie still counts as alive).
                if matches!(
                    e,
                    pagewise::track::Error::Mech(pagewise::MechError::ProcessExited(_))
                ) || e.errno() == libc::ESRCH
                    || !pagewise::process::is_alive(pid)
                {
                    bail!("process {pid} exited after {n} collections");
                }
                if matches!(
                    e,
                    pagewise::track::Error::Mech(pagewise::MechError::ProgramReplaced(_))
                ) {
                    bail!("{e} (after {n} collections)");
                }
                // The shim answered, then its program exec'd another (a
                // wrapper such as a pyenv shim): the socket closed with the
                // old image; the new one runs on under the same pid.
                let lost = [libc::EPIPE, libc::ECONNRESET, libc::EIO].contains(&e.errno());
                if matches!(source, Source::Shim(..)) && lost {
                    let t = DirtyTracker::for_process(pid, a.backend).map_err(|outside| {
                        anyhow::anyhow!("collecting from pid {pid}: {e}; watching it from outside failed too: {outside}")
                    })?;
                    eprintln!(
                        "pagewise: the preload shim in {} went away with the program still \
                         running (it exec'd another?): tracking pid {pid} from outside",
                        a.cmd[0]
                    );
                    source = Source::Outside(t, pid);
                    continue;
                }
                bail!("collecting from pid {pid}: {e}");
            }
        };
        n += 1;
        print(
            &a,
            (pid, None),
            backend,
            t0,
            &c,
            source.regions(),
            &mut regions,
        )?;
    }
    if let Some(code) = stop.status() {
        // SIGINT/SIGTERM: the command ended as the convention says.
        let st = child.as_mut().map(|c| stop.end(c));
        if !a.json {
            let of = st.map(|st| format!("; {} ended ({st})", a.cmd[0]));
            eprintln!(
                "pagewise: stopped by signal {} after {n} collections{}",
                code - 128,
                of.unwrap_or_default()
            );
        }
        return Ok(code);
    }
    if let Some(mut c) = child {
        // --count reached: the command is asked to end (SIGTERM), and
        // killed only if it has not within 5 s.
        pagewise::agent::child::stop(&mut c, crate::stop::GRACE);
    }
    Ok(0)
}

/// `track --json`: one object a collection.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Line {
    /// When, since tracking began.
    pub t_ms: u64,
    /// The process.
    pub pid: i32,
    /// The backend that tracked it.
    pub backend: &'static str,
    /// Pages written since the last collection.
    pub dirty_pages: u64,
    /// The same in bytes.
    pub dirty_bytes: u64,
    /// The pages written, as `[start address, pages]` pairs.
    pub ranges: Vec<[u64; 2]>,
    /// How many pairs.
    pub range_count: u64,
    /// Bytes written per second over the interval.
    pub dirty_rate_bytes_per_s: f64,
    /// What the collection cost.
    pub collect_ns: u64,
    /// Pages the collection looked at.
    pub pages_scanned: u64,
    /// The mappings tracked, as `[start, length in bytes]` pairs: on the
    /// first line and whenever they change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regions: Option<Vec<[u64; 2]>>,
    /// With --container or --cgroup: the process's pid inside its pid
    /// namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_pid: Option<i32>,
    /// With --container or --cgroup: the container it runs in, where its
    /// cgroup path names one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<pagewise::process::ContainerRef>,
}
impl crate::json::Printed for Line {}

/// Prints collection `c` (JSON or a line of text); `now` the mappings
/// tracked, written in JSON when they differ from `regions`.
fn print(
    a: &Args,
    (pid, member): (i32, Option<&Member>),
    backend: BackendKind,
    t0: Instant,
    c: &Collection,
    now: Vec<[u64; 2]>,
    regions: &mut Vec<[u64; 2]>,
) -> Result<()> {
    let stdout = std::io::stdout();
    let t_ms = t0.elapsed().as_millis() as u64;
    let bytes = c.stats.pages_dirty * PAGE_SIZE as u64;
    let rate = bytes as f64 / (a.interval as f64 / 1000.0);
    let mut out = stdout.lock();
    if a.json {
        let ranges: Vec<[u64; 2]> = c.ranges.iter().map(|r| [r.start, r.pages]).collect();
        // The mappings tracked, on the first line and whenever they
        // change: what `report` draws per mapping.
        let changed = (now != *regions).then(|| {
            *regions = now.clone();
            now
        });
        let v = Line {
            t_ms,
            pid,
            backend: backend.name(),
            dirty_pages: c.stats.pages_dirty,
            dirty_bytes: bytes,
            ranges,
            range_count: c.stats.ranges,
            dirty_rate_bytes_per_s: rate,
            collect_ns: c.stats.elapsed_ns,
            pages_scanned: c.stats.pages_scanned,
            regions: changed,
            ns_pid: member.and_then(|m| m.ns_pid),
            container: member.and_then(|m| m.container.clone()),
        };
        writeln!(out, "{}", crate::json::line(&v)?)?;
    } else {
        if let Some(m) = member {
            let inside = match m.ns_pid {
                Some(n) if n != pid => format!(" ({n} inside)"),
                _ => String::new(),
            };
            write!(out, "pid {pid}{inside}: ")?;
        }
        writeln!(
            out,
            "{t_ms:>8} ms  {:>9} pages dirty ({:>8.1} MiB)  {:>7} ranges  {:>8.1} MiB/s  collect {:.2} ms of {} pages",
            c.stats.pages_dirty,
            bytes as f64 / 1048576.0,
            c.stats.ranges,
            rate / 1048576.0,
            c.stats.elapsed_ns as f64 / 1e6,
            c.stats.pages_scanned
        )?;
    }
    out.flush()?;
    Ok(())
}

/// One process of a group being tracked: its source, what the kernel says
/// of it, and the mappings last printed.
struct Watching {
    source: Source,
    member: Member,
    regions: Vec<[u64; 2]>,
}

/// Starts tracking `pid` of a group (said, unless --json); `None`, said,
/// where it cannot be (it ended meanwhile, or refuses).
fn watch_member(a: &Args, member: Member) -> Option<Watching> {
    let pid = member.pid;
    match DirtyTracker::for_process(pid, a.backend) {
        Ok(t) => {
            if let Some(n) = t.note() {
                eprintln!("pagewise: pid {pid}: {n}");
            }
            Some(Watching {
                source: Source::Outside(t, pid),
                member,
                regions: Vec::new(),
            })
        }
        Err(e) => {
            eprintln!("pagewise: pid {pid} is not tracked: {e}");
            None
        }
    }
}

/// `track --container/--cgroup`: every process of the group tracked from
/// outside, new ones from the collection after they appear, ended ones
/// dropped (said); ends with the group, --count, or a signal.
fn run_group(a: &Args, stop: &Stop) -> Result<i32> {
    let mut known = Vec::new();
    a.groups.add_to(&mut known)?;
    let mut watched: Vec<Watching> = a
        .groups
        .members_now()
        .into_iter()
        .filter(|m| known.contains(&m.pid))
        .filter_map(|m| watch_member(a, m))
        .collect();
    if watched.is_empty() {
        bail!("no process of the group could be tracked");
    }
    if !a.json {
        eprintln!(
            "pagewise: tracking {} processes every {} ms",
            watched.len(),
            a.interval
        );
    }
    let t0 = Instant::now();
    let mut n = 0u64;
    let mut next = Instant::now();
    while a.count.is_none_or(|c| n < c) {
        next += Duration::from_millis(a.interval);
        if stop.sleep(next.saturating_duration_since(Instant::now())) {
            break;
        }
        let new = a.groups.newcomers(&mut known, true);
        if !new.is_empty() {
            let now = a.groups.members_now();
            for m in now.into_iter().filter(|m| new.contains(&m.pid)) {
                watched.extend(watch_member(a, m));
            }
        }
        let mut gone = Vec::new();
        for (i, w) in watched.iter_mut().enumerate() {
            let pid = w.member.pid;
            match w.source.collect() {
                Ok(c) => {
                    let now = w.source.regions();
                    let backend = w.source.backend();
                    print(
                        a,
                        (pid, Some(&w.member)),
                        backend,
                        t0,
                        &c,
                        now,
                        &mut w.regions,
                    )?;
                }
                Err(e) => {
                    if !pagewise::process::is_alive(pid)
                        || e.errno() == libc::ESRCH
                        || matches!(
                            e,
                            pagewise::track::Error::Mech(pagewise::MechError::ProcessExited(_))
                        )
                    {
                        eprintln!("pagewise: pid {pid} ended; no longer tracked");
                    } else {
                        eprintln!("pagewise: pid {pid} is no longer tracked: {e}");
                    }
                    gone.push(i);
                }
            }
        }
        for i in gone.into_iter().rev() {
            watched.remove(i);
        }
        n += 1;
        if watched.is_empty() {
            eprintln!("pagewise: every process of the group ended, after {n} collections");
            return Ok(0);
        }
    }
    if let Some(code) = stop.status() {
        if !a.json {
            eprintln!(
                "pagewise: stopped by signal {} after {n} collections",
                code - 128
            );
        }
        return Ok(code);
    }
    Ok(0)
}
