//! The reset made inside the program ([`pagewise_snap::process::inside`]),
//! measured as a fuzzer meets it: `pagewise snapshot afl` serves a target
//! of its own ([`TARGET_C`]) and this side speaks AFL++'s fork-server
//! protocol to it, as `afl-fuzz` would: the input written to a file and
//! its offset set to 0, a control word, the pid, the status.
//!
//! Figures: the reset's own time, from the histogram the shim keeps
//! (`--stats`: `inside_reset_spread`, 0.5 µs buckets, each figure a
//! bucket's upper edge); as the fuzzer waits for it, from the control
//! word to the pid told (`asked`); and the whole execution, from the
//! control word to the status (`cycle`). Its phases are the shim's means.
//!
//! Checked by the target itself at each run, against the pattern it wrote
//! at start-up (a run that finds anything else ends with status 1, and
//! this side fails): the counter in its data is the point's, the words
//! the last run wrote hold their pattern again, every 16th run 8 whole
//! pages chosen anew, and after the last reset every page. Each seed's
//! answer (its exit status) is the same every time; no reset failed or
//! took the program's start again.

use crate::reset::{Dist, Row};
use anyhow::{bail, ensure, Context, Result};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// The target (see its head).
const TARGET_C: &str = include_str!("../c/reset_target.c");

/// Builds the target in `dir`.
pub(crate) fn build(dir: &Path) -> Result<PathBuf> {
    crate::compile_c(dir, "reset_target", TARGET_C, &["-O2"])
}

/// `pagewise snapshot afl` serving the target, and this side's ends of
/// the two pipes.
struct Served {
    child: std::process::Child,
    ctl: std::fs::File,
    st: std::fs::File,
    input: std::fs::File,
    stats: PathBuf,
}

impl Served {
    fn start(target: &Path, mib: usize, dir: &Path) -> Result<Served> {
        let pipe = || -> Result<(OwnedFd, OwnedFd)> {
            let (r, w) = std::io::pipe()?;
            Ok((r.into(), w.into()))
        };
        let (ctl_r, ctl_w) = pipe()?;
        let (st_r, st_w) = pipe()?;
        let input = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join(".cur_input"))?;
        let stats = dir.join("served.json");
        let _ = std::fs::remove_file(&stats);
        let mut c = Command::new(crate::pagewise_tool()?);
        c.args(["snapshot", "afl", "--stats"])
            .arg(&stats)
            .arg("--")
            .arg(target)
            .arg(mib.to_string())
            .stdin(input.try_clone()?)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("served.err"))?);
        let (a, b) = (ctl_r.as_raw_fd(), st_w.as_raw_fd());
        // SAFETY: the closure calls dup2 alone (async-signal-safe), on
        // descriptors open until the spawn returns.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut c, move || {
                if libc::dup2(a, 198) < 0 || libc::dup2(b, 199) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        pagewise_agent::child::tie(&mut c);
        let child = c.spawn().context("starting pagewise snapshot afl")?;
        drop((ctl_r, st_w));
        let mut s = Served {
            child,
            ctl: ctl_w.into(),
            st: st_r.into(),
            input,
            stats,
        };
        s.word().context("the fork server's hello")?;
        Ok(s)
    }

    fn word(&mut self) -> Result<u32> {
        let mut b = [0u8; 4];
        self.st
            .read_exact(&mut b)
            .context("a word from the fork server (did it end? see served.err)")?;
        Ok(u32::from_ne_bytes(b))
    }

    /// One execution of `input`: the time to the pid told and to the
    /// status, µs, and the status.
    fn run(&mut self, input: &[u64; 5]) -> Result<(f64, f64, u32)> {
        let bytes: Vec<u8> = input.iter().flat_map(|w| w.to_ne_bytes()).collect();
        self.input.seek(SeekFrom::Start(0))?;
        self.input.write_all(&bytes)?;
        self.input.seek(SeekFrom::Start(0))?;
        let t0 = Instant::now();
        self.ctl.write_all(&0u32.to_ne_bytes())?;
        self.word().context("the pid of a run")?;
        let asked = t0.elapsed();
        let status = self.word().context("the status of a run")?;
        let whole = t0.elapsed();
        Ok((asked.as_secs_f64() * 1e6, whole.as_secs_f64() * 1e6, status))
    }

    /// Closes the control pipe, as afl-fuzz does at its end: what the
    /// server served (`--stats`).
    fn end(mut self) -> Result<serde_json::Value> {
        drop(std::mem::replace(
            &mut self.ctl,
            std::fs::File::open("/dev/null")?,
        ));
        let limit = std::time::Duration::from_secs(30);
        let Some(st) = pagewise_agent::child::wait_for(&mut self.child, limit) else {
            bail!("pagewise snapshot afl did not end within 30 s of the control pipe's close");
        };
        ensure!(st.success(), "pagewise snapshot afl failed: {st}");
        let text = std::fs::read_to_string(&self.stats).context("reading --stats")?;
        Ok(serde_json::from_str(&text)?)
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Seeds the inputs cycle through (each answered more than once).
const SEEDS: u64 = 8;
/// Every this many runs, whole pages are checked too.
const CHECK_EVERY: usize = 16;
/// Whole pages checked then.
const CHECK_PAGES: u64 = 8;

/// The reset inside at one point: `reps` executions of inputs writing
/// `k` pages of `mib` MiB.
pub(crate) fn inside(target: &Path, reps: usize, mib: usize, k: usize) -> Result<Row> {
    let dir = std::env::temp_dir().join(format!("pagewise-bench-reset-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let r = measure(target, &dir, reps, mib, k);
    let _ = std::fs::remove_dir_all(&dir);
    r
}

fn measure(target: &Path, dir: &Path, reps: usize, mib: usize, k: usize) -> Result<Row> {
    let mut s = Served::start(target, mib, dir)?;
    let mut first = vec![None; SEEDS as usize];
    let (mut asked, mut cycle) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    let mut checked = 0u64;
    let mut prev = u64::MAX;
    // One run more than measured: the first is the program's own start.
    for rep in 0..=reps {
        let seed = rep as u64 % SEEDS;
        let check = if rep % CHECK_EVERY == 0 {
            CHECK_PAGES
        } else {
            0
        };
        let (a, c, status) = s.run(&[seed, k as u64, prev, rep as u64, check])?;
        let code = status >> 8;
        ensure!(
            status & 0x7f == 0 && code >= 2,
            "run {rep} (seed {seed}) found the state other than at the point (status {status:#x}): \
             a reset left something behind"
        );
        match first[seed as usize] {
            None => first[seed as usize] = Some(code),
            Some(f) if f != code => {
                bail!("run {rep}: input {seed} answered {code}, {f} the first time")
            }
            Some(_) => {}
        }
        checked += check;
        prev = seed;
        if rep > 0 {
            asked.push(a);
            cycle.push(c);
        }
    }
    // Every page, after the last reset.
    let (_, _, status) = s.run(&[0, 0, prev, 0, u64::MAX])?;
    ensure!(
        status >> 8 >= 2,
        "after the last reset, a page differed from the point (status {status:#x})"
    );
    checked += mib as u64 * 256;
    let st = s.end()?;
    let n = |key: &str| st[key].as_u64().unwrap_or(0);
    ensure!(
        n("failed_resets") == 0 && n("starts") == 1 && st["inside_refused"].is_null(),
        "every reset was to be made inside one program: {st}"
    );
    ensure!(
        n("inside_resets") == reps as u64 + 1,
        "{} resets were made inside, {} asked: {st}",
        n("inside_resets"),
        reps + 1
    );
    let d = &st["inside_reset_spread"];
    let f = |key: &str| d[key].as_f64().context("inside_reset_spread in --stats");
    let reset_us = Dist {
        median: f("p50_us")?,
        p99: f("p99_us")?,
        min: f("min_us")?,
        max: f("max_us")?,
    };
    let mut phases = pagewise_snap::ResetPhases::default();
    phases.walk_us = st["reset_phases"]["walk_us"].as_f64().unwrap_or(0.0);
    phases.copy_us = st["reset_phases"]["copy_us"].as_f64().unwrap_or(0.0);
    Ok(Row {
        variant: "inside".into(),
        placement: String::new(),
        mib,
        k,
        reps,
        reset_us,
        cycle_us: Dist::of(cycle),
        resets_per_s: 1e6 / reset_us.median,
        phases: Some(phases),
        full_resets: 0,
        pages_checked: checked,
        asked_us: Some(Dist::of(asked)),
        collapsed_mib: st["inside_collapsed_mib"].as_f64(),
        point_ms: st["inside_point_ms"]
            .as_f64()
            .zip(st["inside_collapse_ms"].as_f64()),
    })
}
