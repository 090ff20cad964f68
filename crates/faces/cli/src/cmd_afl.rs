//! `pagewise snapshot afl`: AFL++'s fork server, each execution a reset of
//! one process ([`pagewise::snap::process::afl`]).

use anyhow::{bail, Result};
use pagewise::snap::process::afl::{self, ServeOptions};
use std::ffi::OsString;
use std::time::Duration;

pub const AFL_HELP: &str = "\
Run by afl-fuzz in place of the program, which it starts and holds just
before its first read of its input; each execution resets it there:

  AFL_SKIP_BIN_CHECK=1 afl-fuzz -i seeds -o findings -- \\
      pagewise snapshot afl -- ./target --its-options

The program reads its input from standard input, built with afl-cc
(otherwise unmodified: no __AFL_LOOP, no __AFL_INIT). AFL_SKIP_BIN_CHECK
is needed because afl-fuzz looks for AFL++'s marks in the program it runs,
pagewise, not the target. A run ends when the program calls exit_group,
or takes a signal that would end it (a crash, reported to afl-fuzz as
one); afl-fuzz's timeout kills it, and it is started again. What a run
does outside its memory (files written, children started) stays done.

Resets are made inside the program, by pagewise's preload shim (x86-64,
a single-threaded program that reads its input through the C library):
no ptrace stop and no copy between processes per execution. A run that
moved the break, mapped memory or opened descriptors is put back there
too; one that unmapped, moved or re-protected a mapping of the point,
closed a descriptor of the point, left a thread or set an alternate
signal stack cannot be, and the program is started again for the next
run. A program that cannot be reset from inside (threads at its first
read, say) is reset from outside, with ptrace, as with --outside: there a
run that changed the program's layout is reset by the whole path of a
restore, and one that cannot be reset at all starts the program again.
The first restart warns. At its end (afl-fuzz closing the control
descriptor, or SIGTERM) it says on standard error how many runs it
served and how each was reset.";

#[derive(clap::Args)]
pub struct AflArgs {
    /// The descriptor the program reads its input from.
    #[arg(long, value_name = "FD", default_value_t = 0)]
    input_fd: i32,
    /// How long the program may take to reach its first read.
    #[arg(long, value_name = "MS", default_value_t = 10_000)]
    start_timeout_ms: u64,
    /// Reset the program from outside (ptrace, as before resets inside the
    /// program), even where the preload shim could reset it from inside.
    #[arg(long)]
    outside: bool,
    /// Leave the program's state in the pages it is in at its point. By
    /// default the shim collapses each 2 MiB block of anonymous memory
    /// populated whole into a huge page (`MADV_COLLAPSE`), so that a reset
    /// walks one entry for a block no run wrote; the copy this makes at
    /// start-up is `inside_collapse_ms` in --stats.
    #[arg(long)]
    no_huge_pages: bool,
    /// What was served (runs, crashes, starts, resets that took the whole
    /// path) as one JSON object into FILE, every second and at the end.
    #[arg(long, value_name = "FILE")]
    stats: Option<std::path::PathBuf>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    cmd: Vec<OsString>,
}

pub fn run(a: AflArgs) -> Result<i32> {
    if let Err(fd) = afl::take_descriptors() {
        bail!(
            "descriptor {fd} is not open: `pagewise snapshot afl` is run by afl-fuzz \
             (see --help)"
        );
    }
    let mut opts = ServeOptions::default();
    opts.input_fd = a.input_fd;
    opts.start_limit = Duration::from_millis(a.start_timeout_ms);
    opts.inside = !a.outside;
    opts.huge_pages = !a.no_huge_pages;
    let mut failed = None;
    // The last stats told, for the summary at the end: afl-fuzz ends its
    // fork server with SIGTERM, and that end says what was served too.
    let last = std::sync::Arc::new(std::sync::Mutex::new(afl::ServeStats::default()));
    {
        let last = last.clone();
        pagewise::agent::stop::on_stop_otherwise(move |sig| {
            let s = last.lock().unwrap_or_else(|e| e.into_inner());
            eprintln!("{}", summary(&s));
            std::process::exit(128 + sig);
        })?;
    }
    let mut warned = false;
    let mut save = |stats: &afl::ServeStats| {
        *last.lock().unwrap_or_else(|e| e.into_inner()) = stats.clone();
        if stats.failed_resets > 0 && !warned {
            warned = true;
            eprintln!(
                "pagewise snapshot afl: warning: a reset failed and the program was started \
                 again ({}); every run that cannot be reset is a start",
                stats.failed_reasons.first().map_or("no reason kept", |r| r)
            );
        }
        let Some(path) = &a.stats else { return };
        let out = StatsOutput {
            stats: stats.clone(),
        };
        // Written whole, then renamed: a reader never sees half of it.
        let tmp = path.with_extension("tmp");
        let r = crate::json::line(&out)
            .and_then(|l| Ok(std::fs::write(&tmp, l + "\n")?))
            .and_then(|()| Ok(std::fs::rename(&tmp, path)?));
        if let Err(e) = r {
            failed.get_or_insert(e);
        }
    };
    let served = afl::serve(&a.cmd, afl::CONTROL_FD, afl::STATUS_FD, &opts, &mut save)?;
    eprintln!("{}", summary(&served));
    if let Some(e) = failed {
        return Err(e.context("writing --stats"));
    }
    Ok(0)
}

/// What was served, in one line: the runs, how each was reset, and the
/// starts.
fn summary(s: &afl::ServeStats) -> String {
    let mut out = format!(
        "pagewise snapshot afl: {} run(s), {} crash(es); resets: {} inside the program, {} by \
         the quick path from outside, {} by the whole path",
        s.runs,
        s.crashes,
        s.inside_resets,
        s.runs
            .saturating_sub(s.full_resets)
            .saturating_sub(s.inside_resets)
            .saturating_sub(if s.inside_resets > 0 { s.starts } else { 0 }),
        s.full_resets
    );
    if !s.full_reasons.is_empty() {
        out += &format!(" ({})", s.full_reasons.join("; "));
    }
    out += &format!(
        ", {} failed; the program started {} time(s)",
        s.failed_resets, s.starts
    );
    if let Some(why) = s.failed_reasons.first() {
        out += &format!(" (first failure: {why})");
    }
    if let Some(d) = &s.inside_reset_spread {
        out += &format!(
            "; a reset inside took {:.1} µs (median; 99th percentile {:.1}, longest {:.1})",
            d.p50_us, d.p99_us, d.max_us
        );
        out += &format!(
            "; its point took {:.1} ms ({:.0} MiB collapsed into huge pages in {:.1} ms)",
            s.inside_point_ms, s.inside_collapsed_mib, s.inside_collapse_ms
        );
    }
    if let Some(why) = &s.inside_refused {
        out += &format!("; not reset from inside: {why}");
    }
    out
}

/// `--stats`: what the fork server served.
#[derive(serde::Serialize, schemars::JsonSchema)]
pub struct StatsOutput {
    #[serde(flatten)]
    stats: afl::ServeStats,
}

impl crate::json::Printed for StatsOutput {}
