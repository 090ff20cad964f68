//! `pagewise snapshot`: snapshots of another process into a durable store,
//! and reading stores back (`inspect`, `diff`).

use crate::stop::Stop;
use anyhow::Result;
use pagewise::snap::remote::snapshot_process;
use pagewise::snap::DiskStore;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct Args {
    #[command(subcommand)]
    sub: Option<Sub>,
    #[command(flatten)]
    take: TakeArgs,
}

#[derive(clap::Args)]
struct TakeArgs {
    /// The process to snapshot (its writable memory). It is stopped briefly
    /// (ptrace) for each snapshot and resumed.
    #[arg(long)]
    pid: Option<i32>,
    /// Instead of --pid: every process of a container or cgroup, all
    /// stopped at one instant for each snapshot (the cgroup frozen while
    /// they are seized, where one holds exactly them), one snapshot per
    /// process in the store.
    #[command(flatten)]
    groups: crate::groups::Groups,
    /// The store directory (created if missing or empty; appended to otherwise).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Take a snapshot every MS milliseconds (with --count).
    #[arg(long = "every-ms", alias = "every", value_name = "MS")]
    every: Option<u64>,
    /// Number of snapshots to take.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// Free text stored with each snapshot.
    #[arg(long, default_value = "")]
    label: String,
    /// Trust the 128-bit digest when a page matches a stored one, instead of
    /// comparing contents (faster; see the store's documentation).
    #[arg(long)]
    no_verify: bool,
    /// One JSON object per snapshot on stdout.
    #[arg(long)]
    json: bool,
    /// A live checkpoint: copy while the process runs, pass after pass over
    /// what it wrote meanwhile (uffd-wp from outside), and stop it only for
    /// the rest, once that fits --max-downtime-ms.
    /// With --every-ms and --count, each checkpoint after the first starts
    /// from what the process wrote since the one before.
    #[arg(long)]
    live: bool,
    /// With --live: the longest the process may be stopped.
    #[arg(long, value_name = "MS", default_value_t = 50.0)]
    max_downtime_ms: f64,
    /// With --live: passes before it stops the process whatever is left.
    #[arg(long, default_value_t = 30)]
    max_passes: usize,
    /// With --live: slow the process down (stop it for a growing share of
    /// each pass) when it writes faster than pages can be copied.
    #[arg(long)]
    throttle: bool,
    /// With --live, instead of --out: stream the passes over TCP to
    /// `pagewise receive` listening at HOST:PORT, which saves the snapshot
    /// into its store (memory migration).
    #[arg(
        long,
        value_name = "HOST:PORT",
        requires = "live",
        conflicts_with = "out"
    )]
    to: Option<String>,
    /// With --to: compress pages on the wire with LZ4: auto (where it saves
    /// an eighth or more), lz4 (always) or none.
    #[arg(long, value_name = "HOW", default_value = "auto", requires = "to")]
    compress: pagewise::snap::wire::Compression,
    /// With --to: authenticate every message with the shared secret in
    /// FILE (owner-only; the receiver's --key). Needed by a receiver that
    /// listens beyond loopback.
    #[arg(long, value_name = "FILE", requires = "to")]
    key: Option<PathBuf>,
}

#[derive(clap::Subcommand)]
enum Sub {
    /// Show a store: its snapshots, sizes, unique and zero pages, dedup ratio.
    Inspect {
        /// The store directory.
        dir: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Hold a running process for repeated rollbacks: take snapshots of it
    /// and put any of them back, driven by one request per line on stdin
    /// (one JSON line answers each).
    #[command(after_help = crate::cmd_rollback::SERVE_HELP)]
    Serve(crate::cmd_rollback::ServeArgs),
    /// Put a snapshot of a store back into the running process it was
    /// taken of: memory, layout and threads' registers, in place.
    #[command(after_help = crate::cmd_rollback::RESTORE_HELP)]
    Restore(crate::cmd_rollback::RestoreArgs),
    /// AFL++'s fork server: each execution of afl-fuzz a reset of one
    /// process, held just before it read its input.
    #[command(after_help = crate::cmd_afl::AFL_HELP)]
    Afl(crate::cmd_afl::AflArgs),
    /// Write a snapshot's pages to a file (raw bytes), for other tools.
    Extract(crate::cmd_rollback::ExtractArgs),
    /// Page ranges whose contents differ between snapshots A and B of a store.
    Diff {
        /// The store directory.
        dir: PathBuf,
        /// First snapshot id.
        a: u64,
        /// Second snapshot id.
        b: u64,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
}

pub fn run(a: Args) -> Result<i32> {
    match a.sub {
        Some(Sub::Inspect { dir, json }) => inspect(dir, json),
        Some(Sub::Diff { dir, a, b, json }) => diff(dir, a, b, json),
        Some(Sub::Serve(s)) => crate::cmd_rollback::serve(s),
        Some(Sub::Restore(r)) => crate::cmd_rollback::restore(r),
        Some(Sub::Extract(e)) => crate::cmd_rollback::extract(e),
        Some(Sub::Afl(a)) => crate::cmd_afl::run(a),
        None => take(a.take),
    }
}

fn take(t: TakeArgs) -> Result<i32> {
    let stop = Stop::take()?;
    if t.count == 0 {
        crate::usage!("--count must be at least 1");
    }
    if t.count > 1 && t.every.is_none() {
        crate::usage!("--count above 1 needs --every-ms MS");
    }
    if let (Some(pid), Some(to)) = (t.pid, t.to.as_deref()) {
        pagewise::process::check_target(pid)?;
        let key = wire_key(&t)?;
        let mut tx = pagewise::snap::wire::Sender::connect_with(to, t.compress, key.as_ref())?;
        take_live(&t, pid, &mut tx, &stop)?;
        let w = tx.stats();
        if !t.json {
            println!(
                "sent to {to}: {:.1} MiB of pages as {:.1} MiB on the wire ({} chunks LZ4, {} raw, {} zero; {:.0} ms compressing)",
                w.page_bytes as f64 / 1048576.0,
                w.wire_bytes as f64 / 1048576.0,
                w.chunks_lz4,
                w.chunks_raw,
                w.chunks_zero,
                w.compress_ms
            );
        }
        return Ok(stop.status().unwrap_or(0));
    }
    if t.groups.given() {
        return take_group(&t, &stop);
    }
    let (Some(pid), Some(out)) = (t.pid, t.out.clone()) else {
        crate::usage!("give --pid PID and --out DIR, or --live --to HOST:PORT (or a subcommand: inspect, diff; see --help)");
    };
    pagewise::process::check_target(pid)?;
    let existed = out.exists();
    let mut disk = DiskStore::create(&out, !t.no_verify)?;
    let r = if t.live {
        take_live(
            &t,
            pid,
            &mut pagewise::snap::live::StoreSeries::new(&mut disk),
            &stop,
        )
    } else {
        take_into(&t, pid, &mut disk, &stop)
    };
    finish_store(r, disk, &out, existed, t.json, &stop)
}

/// The end of a command that saved into store `out`: a store it created
/// (it had not `existed`) and never saved into is not left behind (on an
/// error); otherwise where it is, and the exit status (SIGINT/SIGTERM
/// between snapshots: those taken are kept).
fn finish_store(
    r: Result<()>,
    disk: DiskStore,
    out: &std::path::Path,
    existed: bool,
    json: bool,
    stop: &Stop,
) -> Result<i32> {
    if r.is_err() && !existed && disk.ids().is_ok_and(|ids| ids.is_empty()) {
        drop(disk);
        let _ = std::fs::remove_dir_all(out);
    }
    r?;
    if !json {
        println!(
            "store: {} (see `pagewise snapshot inspect {}`)",
            out.display(),
            out.display()
        );
    }
    Ok(stop.status().unwrap_or(0))
}

fn take_live(
    t: &TakeArgs,
    pid: i32,
    dest: &mut dyn pagewise::snap::live::Destination,
    stop: &Stop,
) -> Result<()> {
    use pagewise::snap::live::{Checkpointer, LiveOptions, ProcessSource};
    let opts = LiveOptions::default()
        .max_downtime_ms(t.max_downtime_ms)
        .max_passes(t.max_passes.max(1))
        .throttle(t.throttle);
    let mut cp = Checkpointer::new(ProcessSource::new(pid)?, opts);
    let every = Duration::from_millis(t.every.unwrap_or(0));
    let start = Instant::now();
    for i in 0..t.count {
        let due = start + every * i as u32;
        if stop.sleep(due.saturating_duration_since(Instant::now())) {
            break;
        }
        let bar = crate::progress::spinner("copying while the process runs");
        let mut n = 0;
        let r = cp.checkpoint(
            dest,
            &t.label,
            &mut |p| {
                n += 1;
                bar.set_message(format!("pass {n}: {} pages in {:.1} ms", p.pages, p.ms));
            },
            &mut || {},
        )?;
        bar.finish_and_clear();
        print_live(t, &r)?;
    }
    Ok(())
}

/// `snapshot --json`: one object a snapshot taken (`--every-ms`), or the
/// report of a live copy (`--live`).
#[derive(serde::Serialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum Line<'a> {
    /// A live copy or migration, pass by pass.
    Live(&'a pagewise::snap::live::LiveReport),
    /// A snapshot saved into the store.
    Taken(&'a pagewise::snap::remote::ProcessSnapshot),
    /// A snapshot of every process of a container or cgroup, stopped at
    /// one instant.
    Group(&'a pagewise::snap::remote::GroupSnapshot),
}
impl crate::json::Printed for Line<'_> {}

fn print_live(t: &TakeArgs, r: &pagewise::snap::live::LiveReport) -> Result<()> {
    if t.json {
        println!("{}", crate::json::line(&Line::Live(r))?);
        return Ok(());
    }
    for (i, p) in r.passes.iter().enumerate() {
        println!(
            "pass {:>3}: {:>9} pages in {:>8.1} ms{}",
            i,
            p.pages,
            p.ms,
            if p.throttle > 0.0 {
                format!(" (process held {:.0} % of the time)", p.throttle * 100.0)
            } else {
                String::new()
            }
        );
    }
    println!(
        "stopped: {} pages in {:.2} ms (budget {} ms){}",
        r.final_pages,
        r.downtime_ms,
        t.max_downtime_ms,
        if r.converged {
            String::new()
        } else {
            format!(
                "; did not converge in {} passes: the process wrote {:.0} MiB/s against a copy rate of {:.0} MiB/s (--throttle slows it down)",
                r.passes.len(),
                r.dirty_rate_bps / 1048576.0,
                r.copy_rate_bps / 1048576.0
            )
        }
    );
    println!(
        "snapshot {}: {} pages, {:.1} MiB copied, {:.1} ms until the process ran on, {:.1} ms in all",
        r.save.id,
        r.save.pages,
        r.bytes_copied as f64 / 1048576.0,
        r.copy_ms,
        r.total_ms
    );
    if t.to.is_some() {
        println!(
            "the receiver held the whole copy {:.1} ms after the stop (the downtime of a migration)",
            r.handover_ms
        );
    }
    Ok(())
}

fn take_into(t: &TakeArgs, pid: i32, disk: &mut DiskStore, stop: &Stop) -> Result<()> {
    let every = Duration::from_millis(t.every.unwrap_or(0));
    let start = Instant::now();
    // More than one snapshot: after the first, read only what was written
    // (uffd-wp from outside), where it can be had.
    let mut incremental = if t.count > 1 {
        match pagewise::snap::remote::Incremental::new(pid) {
            Ok(i) => Some(i),
            Err(e) => {
                if !t.json {
                    eprintln!("pagewise: every snapshot reads all of the process's memory: {e}");
                }
                None
            }
        }
    } else {
        None
    };
    for i in 0..t.count {
        let due = start + every * i as u32;
        if stop.sleep(due.saturating_duration_since(Instant::now())) {
            break;
        }
        let s = match incremental.as_mut() {
            Some(inc) => inc.snapshot(disk, &t.label)?,
            None => snapshot_process(pid, disk, &t.label)?,
        };
        if t.json {
            println!("{}", crate::json::line(&Line::Taken(&s))?);
        } else {
            println!(
                "snapshot {:>4}: {} regions, {} pages ({} read, {} zero), {} new pages, {:.1} KiB written; process stopped {:.1} ms, total {:.1} ms",
                s.save.id,
                s.regions,
                s.save.pages,
                s.pages_read,
                s.save.zero_pages,
                s.save.pages_new,
                (s.save.pack_bytes + s.save.index_bytes) as f64 / 1024.0,
                s.stopped_ms,
                s.total_ms
            );
        }
    }
    Ok(())
}

/// Snapshots of every process of the containers or cgroups given, each
/// group stopped at one instant.
fn take_group(t: &TakeArgs, stop: &Stop) -> Result<i32> {
    if t.pid.is_some() {
        crate::usage!("--container and --cgroup take the place of --pid");
    }
    // Sent --to a receiver: taken into a store of this run's own first (at
    // one instant), then each process's snapshot sent, the store removed.
    let (out, sending) = match (&t.out, &t.to) {
        (Some(o), _) => (o.clone(), None),
        (None, Some(to)) => (
            std::env::temp_dir().join(format!("pagewise-group-{}", std::process::id())),
            Some(to.clone()),
        ),
        (None, None) => crate::usage!(
            "give --out DIR (or, with --live, --to HOST:PORT) for the snapshots of --container or --cgroup"
        ),
    };
    let mut pids = Vec::new();
    t.groups.add_to(&mut pids)?;
    for &pid in &pids {
        pagewise::process::check_target(pid)?;
    }
    let existed = out.exists();
    let mut disk = DiskStore::create(&out, !t.no_verify)?;
    let every = Duration::from_millis(t.every.unwrap_or(0));
    // A series reads, after each process's first snapshots, what it wrote
    // since (tracked from outside while the group runs).
    let mut series = if t.count > 1 || t.live {
        pagewise::snap::remote::IncrementalGroup::new(&pids)
    } else {
        pagewise::snap::remote::IncrementalGroup::without_tracking()
    };
    let start = Instant::now();
    let mut r: Result<()> = Ok(());
    for i in 0..t.count {
        let due = start + every * i as u32;
        if stop.sleep(due.saturating_duration_since(Instant::now())) {
            break;
        }
        let list = || t.groups.pids();
        // --live: each process copied while the group runs, then the group
        // stopped at one instant for what it wrote meanwhile.
        let precopy = t
            .live
            .then(|| series.precopy(&mut disk, &format!("{} (pre-copy)", t.label)));
        let g = match series.snapshot(&list, &mut disk, &t.label) {
            Ok(mut g) => {
                g.precopy_pages_read = precopy;
                g
            }
            Err(e) => {
                r = Err(e.into());
                break;
            }
        };
        if let Some(to) = &sending {
            if let Err(e) = send_group(t, &disk, &g, to) {
                r = Err(e);
                break;
            }
        }
        if t.json {
            println!("{}", crate::json::line(&Line::Group(&g))?);
            continue;
        }
        print_group(i, &g);
    }
    if sending.is_some() {
        drop(disk);
        let _ = std::fs::remove_dir_all(&out);
        r?;
        return Ok(stop.status().unwrap_or(0));
    }
    finish_store(r, disk, &out, existed, t.json, stop)
}

/// The shared secret of `--key`, where given, for what is sent `--to`.
fn wire_key(t: &TakeArgs) -> Result<Option<pagewise::snap::wire::Key>> {
    Ok(t.key
        .as_deref()
        .map(pagewise::snap::wire::Key::from_file)
        .transpose()?)
}

/// Each process's snapshot of group snapshot `g` (in `disk`) sent to the
/// receiver at `to`, one connection each, in pid order.
fn send_group(
    t: &TakeArgs,
    disk: &DiskStore,
    g: &pagewise::snap::remote::GroupSnapshot,
    to: &str,
) -> Result<()> {
    let key = wire_key(t)?;
    for m in &g.members {
        let mut tx = pagewise::snap::wire::Sender::connect_with(to, t.compress, key.as_ref())?;
        let saved = pagewise::snap::remote::send_saved(disk, m.snapshot.save.id, &mut tx)?;
        if !t.json {
            println!(
                "sent pid {} to {to}: snapshot {} there, {} pages",
                m.pid, saved.id, saved.pages
            );
        }
    }
    Ok(())
}

/// A group snapshot, as text.
fn print_group(i: u64, g: &pagewise::snap::remote::GroupSnapshot) {
    let how = match &g.frozen {
        Some(dir) => format!("cgroup {} frozen while they were seized", dir.display()),
        None => "stopped one after another, all held together".to_string(),
    };
    let before = match g.precopy_pages_read {
        Some(n) => format!(", after a pre-copy of {n} pages while they ran"),
        None => String::new(),
    };
    println!(
        "group {i}: {} processes stopped {:.1} ms ({how}){before}",
        g.members.len(),
        g.stopped_ms
    );
    for m in &g.members {
        let inside = match m.ns_pid {
            Some(n) if n != m.pid => format!(" ({n} inside)"),
            _ => String::new(),
        };
        println!(
            "  pid {}{inside}: snapshot {}, {} regions, {} pages ({} read, {} new)",
            m.pid,
            m.snapshot.save.id,
            m.snapshot.regions,
            m.snapshot.save.pages,
            m.snapshot.pages_read,
            m.snapshot.save.pages_new
        );
    }
}

/// `snapshot inspect --json`: the store's totals and its snapshots.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct InspectOutput<'a> {
    /// The totals.
    #[serde(flatten)]
    pub stats: &'a pagewise::snap::DiskStats,
    /// Each snapshot, oldest first.
    pub snapshot_list: Vec<Listed>,
}
impl crate::json::Printed for InspectOutput<'_> {}

/// A snapshot of a store.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct Listed {
    /// Its id.
    pub id: u64,
    /// Its label.
    pub label: String,
    /// The process it was taken of, when one.
    pub pid: Option<i32>,
    /// When it was taken (ms since the epoch).
    pub created_ms: u64,
    /// Its regions.
    pub regions: usize,
    /// Its pages.
    pub pages: u64,
    /// Of which zero.
    pub zero_pages: u64,
    /// The memory it represents.
    pub bytes: u64,
    /// The size of its index on disk.
    pub index_bytes: u64,
}

/// `snapshot diff --json`: the pages that differ between two snapshots.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct DiffOutput {
    /// The first snapshot's id.
    pub a: u64,
    /// The second's.
    pub b: u64,
    /// Pages that differ.
    pub pages: u64,
    /// Where, as `[start address, pages]` pairs.
    pub ranges: Vec<[u64; 2]>,
}
impl crate::json::Printed for DiffOutput {}

fn inspect(dir: PathBuf, json: bool) -> Result<i32> {
    let disk = DiskStore::open(&dir)?;
    let list = disk.list()?;
    let stats = disk.stats_of(&list)?;
    if json {
        let snapshot_list = list
            .iter()
            .map(|s| Listed {
                id: s.id,
                label: s.label.clone(),
                pid: s.pid,
                created_ms: s.created_ms,
                regions: s.regions.len(),
                pages: s.pages(),
                zero_pages: s.zero_pages(),
                bytes: s.pages() * pagewise::PAGE_SIZE as u64,
                index_bytes: s.index_bytes,
            })
            .collect();
        let v = InspectOutput {
            stats: &stats,
            snapshot_list,
        };
        println!("{}", crate::json::line(&v)?);
        return Ok(0);
    }
    println!("store {}", dir.display());
    println!(
        "{:>6} {:>8} {:>8} {:>10} {:>10} {:>9}  label",
        "id", "pid", "regions", "pages", "zero", "MiB"
    );
    for s in &list {
        println!(
            "{:>6} {:>8} {:>8} {:>10} {:>10} {:>9.1}  {}",
            s.id,
            s.pid.map_or("-".into(), |p| p.to_string()),
            s.regions.len(),
            s.pages(),
            s.zero_pages(),
            (s.pages() * pagewise::PAGE_SIZE as u64) as f64 / 1048576.0,
            s.label
        );
    }
    println!(
        "{} snapshots: {} references to stored pages and {} zero pages, {} unique pages; {:.1} MiB represented in {:.1} MiB on disk (dedup ratio {:.1}x)",
        stats.snapshots,
        stats.referenced_pages,
        stats.zero_pages,
        stats.unique_pages,
        stats.bytes_represented as f64 / 1048576.0,
        stats.bytes_on_disk as f64 / 1048576.0,
        stats.dedup_ratio
    );
    Ok(0)
}

fn diff(dir: PathBuf, a: u64, b: u64, json: bool) -> Result<i32> {
    let disk = DiskStore::open(&dir)?;
    let ranges = disk.diff(a, b)?;
    let pages: u64 = ranges.iter().map(|r| r.pages).sum();
    if json {
        let rs: Vec<[u64; 2]> = ranges.iter().map(|r| [r.start, r.pages]).collect();
        let v = DiffOutput {
            a,
            b,
            pages,
            ranges: rs,
        };
        println!("{}", crate::json::line(&v)?);
    } else {
        for r in &ranges {
            println!("{:#x} {} pages", r.start, r.pages);
        }
        println!(
            "{pages} pages in {} ranges differ between snapshots {a} and {b}",
            ranges.len()
        );
    }
    Ok(0)
}
