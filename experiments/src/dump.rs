//! SimGrid experiment (c): `pagewise snapshot --pid` against `criu dump` on
//! the same process — time and bytes of the image, for a first snapshot and
//! for one taken after the process changed 1 % of its heap.
//!
//! The target is a forked child holding a heap with a known layout: a quarter
//! of its pages zero-filled (but present), a quarter duplicates of 64
//! contents, a quarter random bytes and a quarter text-like, compressible
//! data. Between two snapshots it rewrites 1 % of its pages on request.
//!
//! CRIU runs only where `criu check` passes; otherwise its rows are absent
//! and the reason is kept in the report (Debian 12's CRIU 3.17 cannot parse
//! the vDSO of Linux 6.13 and later, for example).

use pagewise::{Error, Result, PAGE_SIZE};
use pagewise_mech::workload::{AnonMemory, Rng};
use pagewise_snap::remote::snapshot_process;
use pagewise_snap::DiskStore;
use serde::Serialize;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// One dump of the target.
#[derive(Debug, Clone, Serialize)]
pub struct DumpRow {
    /// The tool and which dump: `pagewise first`, `pagewise after 1 %`,
    /// `criu first`, `criu after 1 %`.
    pub tool: String,
    /// Wall time of the whole dump, including the sync to disk, ms.
    pub ms: f64,
    /// How long the process was stopped, ms, where the tool says.
    pub stopped_ms: Option<f64>,
    /// Bytes this dump added on disk.
    pub bytes: u64,
    /// Bytes of the whole image directory after this dump.
    pub total_bytes: u64,
}

/// What (c) measured.
#[derive(Debug, Clone, Serialize)]
pub struct DumpReport {
    /// The target's heap, MiB.
    pub heap_mib: usize,
    /// The target's resident memory, MiB.
    pub target_rss_mib: f64,
    /// Pages the target rewrote between the two dumps.
    pub pages_changed: u64,
    /// `criu --version`, when CRIU ran.
    pub criu_version: Option<String>,
    /// Why CRIU did not run, when it did not.
    pub criu_skipped: Option<String>,
    /// The dumps.
    pub rows: Vec<DumpRow>,
}

/// The forked target; killed and reaped on drop.
pub(crate) struct Target {
    pub(crate) pid: i32,
    cmd: std::io::PipeWriter,
    ack: std::io::PipeReader,
}

impl Target {
    /// Forks a child that keeps `mem` (already filled) and, for each byte
    /// received, rewrites the pages of `changes` and answers with one byte.
    pub(crate) fn spawn(mem: &AnonMemory, changes: &[usize]) -> Result<Self> {
        let io = |e| Error::os("creating a pipe", e);
        let (mut cmd_r, cmd_w) = std::io::pipe().map_err(io)?;
        let (ack_r, mut ack_w) = std::io::pipe().map_err(io)?;
        // SAFETY: the child allocates nothing and takes no lock: it reads a
        // pipe, writes memory and writes a pipe.
        let pid = unsafe {
            pagewise_sys::process::fork_child(|| {
                let mut b = [0u8; 1];
                while let Ok(1) = cmd_r.read(&mut b) {
                    for &p in changes {
                        mem.write_byte(p * PAGE_SIZE + 17, b[0] ^ 0xa5);
                    }
                    if ack_w.write_all(&[1]).is_err() {
                        return 1;
                    }
                }
                0
            })
        }
        .map_err(|e| Error::os("fork of the target", e))?;
        Ok(Target {
            pid,
            cmd: cmd_w,
            ack: ack_r,
        })
    }

    /// Has the target rewrite its pages, and waits until it has.
    pub(crate) fn change(&mut self, v: u8) -> Result<()> {
        let io = |e| Error::os("talking to the target", e);
        self.cmd.write_all(&[v]).map_err(io)?;
        let mut b = [0u8; 1];
        self.ack.read_exact(&mut b).map_err(io)
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = pagewise_sys::process::kill(self.pid, libc::SIGKILL);
        let _ = pagewise_sys::process::wait_child(self.pid);
    }
}

/// Fills `mem` with the layout of the module docs.
fn fill(mem: &AnonMemory) {
    let mut rng = Rng::new(0xc0ffee);
    let mut page = [0u8; PAGE_SIZE];
    for p in 0..mem.pages() {
        match p % 4 {
            0 => mem.write_byte(p * PAGE_SIZE, 0),
            1 => mem.fill_page(p, 1 + (p / 4 % 64) as u8),
            2 => {
                for w in page.chunks_exact_mut(8) {
                    w.copy_from_slice(&rng.next_u64().to_le_bytes());
                }
                mem.write_at(p * PAGE_SIZE, &page);
            }
            _ => {
                for (k, line) in page.chunks_mut(64).enumerate() {
                    let text = format!(
                        "record {p:>9} field {k:>3} value {:>12};",
                        rng.below(1 << 30)
                    );
                    let n = text.len().min(line.len());
                    line[..n].copy_from_slice(&text.as_bytes()[..n]);
                }
                mem.write_at(p * PAGE_SIZE, &page);
            }
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter(|e| !e.file_name().to_string_lossy().ends_with(".log"))
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `Ok(version)` when `criu check` passes here, else why not.
pub fn criu_usable() -> std::result::Result<String, String> {
    let version = match Command::new("criu").arg("--version").output() {
        Ok(o) => String::from_utf8_lossy(&o.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        Err(e) => {
            return Err(format!(
                "criu is not installed ({e}); scripts/setup.sh installs it"
            ))
        }
    };
    let out = Command::new("criu")
        .arg("check")
        .output()
        .map_err(|e| format!("criu check: {e}"))?;
    if out.status.success() {
        return Ok(version);
    }
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("Error") && !l.contains("exited, status="))
        .map(|l| l.split_once("): ").map_or(l, |x| x.1).trim_end_matches('.'))
        .collect();
    Err(format!(
        "`criu check` fails on this kernel ({version}): {}",
        if errors.is_empty() {
            text.trim().to_string()
        } else {
            errors.join("; ")
        }
    ))
}

/// One `criu dump` of `pid` into `dir`, leaving the process running; with
/// `track`, memory tracking starts (or, with `prev`, continues) so that the
/// next dump can refer to this one's pages.
fn criu_dump(
    pid: i32,
    dir: &Path,
    prev: Option<&Path>,
    track: bool,
) -> std::result::Result<f64, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut cmd = Command::new("criu");
    cmd.args([
        "dump",
        "--leave-running",
        "--shell-job",
        "-v1",
        "-o",
        "dump.log",
        "-t",
    ])
    .arg(pid.to_string())
    .arg("-D")
    .arg(dir);
    if track {
        cmd.arg("--track-mem");
    }
    if let Some(p) = prev {
        // Unchanged pages of the previous dump are referenced, not copied.
        cmd.arg("--prev-images-dir").arg(p);
    }
    let t0 = Instant::now();
    let out = cmd.output().map_err(|e| format!("criu dump: {e}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    if !out.status.success() {
        let log = std::fs::read_to_string(dir.join("dump.log")).unwrap_or_default();
        let last = log
            .lines()
            .rfind(|l| l.contains("Error"))
            .unwrap_or("no log");
        return Err(format!("criu dump failed: {last}"));
    }
    Ok(ms)
}

/// Runs (c) on a heap of `heap_mib` MiB.
pub fn run(heap_mib: usize, progress: &mut dyn FnMut(&str)) -> Result<DumpReport> {
    progress(&format!("(c) target with a {heap_mib} MiB heap"));
    let mem = AnonMemory::new(heap_mib << 20)?;
    fill(&mem);
    let mut rng = Rng::new(7);
    let changes: Vec<usize> = (0..mem.pages() / 100)
        .map(|_| rng.below(mem.pages() as u64) as usize)
        .collect();
    let mut target = Target::spawn(&mem, &changes)?;
    let rss_kib = std::fs::read_to_string(format!("/proc/{}/status", target.pid))
        .ok()
        .and_then(|s| pagewise_testkit::host::status_field(&s, "VmRSS"))
        .unwrap_or(0);
    let work = std::env::temp_dir().join(format!("pagewise-bench-dump-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let result = measure(&mut target, &work, progress);
    let _ = std::fs::remove_dir_all(&work);
    let (rows, criu_version, criu_skipped) = result?;
    Ok(DumpReport {
        heap_mib,
        target_rss_mib: rss_kib as f64 / 1024.0,
        pages_changed: changes.len() as u64,
        criu_version,
        criu_skipped,
        rows,
    })
}

type Measured = (Vec<DumpRow>, Option<String>, Option<String>);

fn measure(target: &mut Target, work: &Path, progress: &mut dyn FnMut(&str)) -> Result<Measured> {
    let mut rows = Vec::new();
    // pagewise: three snapshots into one store, the last without verifying
    // digest matches against the stored contents.
    let store_dir: PathBuf = work.join("pagewise");
    let mut before = 0;
    let runs = [
        ("pagewise first", true),
        ("pagewise after 1 %", true),
        ("pagewise after 1 % (no verify)", false),
    ];
    for (round, (name, verify)) in runs.into_iter().enumerate() {
        if round > 0 {
            target.change(round as u8)?;
        }
        progress(&format!("(c) {name}"));
        let mut disk = DiskStore::create(&store_dir, verify)?;
        let s = snapshot_process(target.pid, &mut disk, name)?;
        let total = disk.stats()?.bytes_on_disk;
        rows.push(DumpRow {
            tool: name.to_string(),
            ms: s.total_ms,
            stopped_ms: Some(s.stopped_ms),
            bytes: total - before,
            total_bytes: total,
        });
        before = total;
    }
    // CRIU: the same two, with the second one incremental where CRIU can track memory.
    let (version, skipped) = match criu_usable() {
        Err(why) => {
            progress(&format!("(c) criu skipped: {why}"));
            (None, Some(why))
        }
        Ok(v) => {
            let first = work.join("criu-1");
            let second = work.join("criu-2");
            let mut skipped = None;
            target.change(3)?;
            progress("(c) criu first");
            // Memory tracking makes the second dump incremental; without it
            // (no soft-dirty bits) both dumps are full.
            let tracked = criu_dump(target.pid, &first, None, true);
            let (first_dump, track) = match tracked {
                Ok(ms) => (Ok(ms), true),
                Err(_) => {
                    let _ = std::fs::remove_dir_all(&first);
                    (criu_dump(target.pid, &first, None, false), false)
                }
            };
            match first_dump {
                Err(why) => skipped = Some(why),
                Ok(ms) => {
                    let b1 = dir_bytes(&first);
                    rows.push(DumpRow {
                        tool: "criu first".into(),
                        ms,
                        stopped_ms: None,
                        bytes: b1,
                        total_bytes: b1,
                    });
                    target.change(4)?;
                    progress("(c) criu after 1 %");
                    let prev = track.then_some(first.as_path());
                    let r = criu_dump(target.pid, &second, prev, track);
                    match r {
                        Err(why) => skipped = Some(why),
                        Ok(ms) => {
                            let b2 = dir_bytes(&second);
                            rows.push(DumpRow {
                                tool: if track {
                                    "criu after 1 % (incremental)".into()
                                } else {
                                    "criu after 1 % (full)".into()
                                },
                                ms,
                                stopped_ms: None,
                                bytes: b2,
                                total_bytes: b1 + b2,
                            });
                        }
                    }
                }
            }
            (Some(v), skipped)
        }
    };
    Ok((rows, version, skipped))
}

impl DumpReport {
    /// Plain-text table.
    pub fn summary(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n(c) snapshot of another process: {} MiB heap ({:.0} MiB resident; 1/4 zero, 1/4 duplicates, 1/4 random, 1/4 text), {} pages changed before the second dump",
            self.heap_mib, self.target_rss_mib, self.pages_changed
        );
        let _ = writeln!(
            s,
            "{:<32} {:>10} {:>12} {:>14} {:>14}",
            "dump", "time (ms)", "stopped (ms)", "added (MiB)", "total (MiB)"
        );
        for r in &self.rows {
            let _ = writeln!(
                s,
                "{:<32} {:>10.1} {:>12} {:>14.2} {:>14.2}",
                r.tool,
                r.ms,
                r.stopped_ms.map_or("-".into(), |v| format!("{v:.1}")),
                r.bytes as f64 / (1 << 20) as f64,
                r.total_bytes as f64 / (1 << 20) as f64
            );
        }
        if let Some(why) = &self.criu_skipped {
            let _ = writeln!(s, "criu: skipped: {why}");
        }
        s
    }
}
