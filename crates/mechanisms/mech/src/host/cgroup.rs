//! Memory cgroups and swap: how full a process's memory is (its cgroup
//! against its limit, or the machine), and the set-ups a run makes and takes
//! down again (a memory cgroup with a limit, swap on zram).

use crate::procfs::{proc_dir, read_trimmed, status_field};
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// The directory of process `pid`'s memory cgroup (`None` for the calling
/// process): cgroup v1's `memory` hierarchy where it is mounted, otherwise
/// the cgroup v2 group when its memory controller is enabled there.
pub fn memory_cgroup_dir(pid: Option<i32>) -> Result<Option<PathBuf>> {
    let path = proc_dir(pid).join("cgroup");
    let groups = std::fs::read_to_string(&path)
        .map_err(|e| Error::os(format!("reading {}", path.display()), e))?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Error::os("reading /proc/self/mountinfo", e))?;
    // The mount points of the v1 memory hierarchy and of cgroup v2.
    let mut v1 = None;
    let mut v2 = None;
    for l in mountinfo.lines() {
        let Some((left, right)) = l.split_once(" - ") else {
            continue;
        };
        let point = left.split_whitespace().nth(4).unwrap_or("");
        let mut r = right.split_whitespace();
        let (fstype, opts) = (r.next().unwrap_or(""), r.nth(1).unwrap_or(""));
        if fstype == "cgroup" && opts.split(',').any(|o| o == "memory") {
            v1 = Some(PathBuf::from(point));
        } else if fstype == "cgroup2" {
            v2 = Some(PathBuf::from(point));
        }
    }
    for l in groups.lines() {
        let mut f = l.splitn(3, ':');
        let (_, ctrl, rel) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
        let rel = rel.trim_start_matches('/');
        if let Some(root) = &v1 {
            if ctrl.split(',').any(|c| c == "memory") {
                return Ok(Some(root.join(rel)));
            }
        }
        if let (Some(root), "") = (&v2, ctrl) {
            if v1.is_none() && root.join(rel).join("memory.max").exists() {
                return Ok(Some(root.join(rel)));
            }
        }
    }
    Ok(None)
}

/// What a memory cgroup uses and may use, bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct MemoryUse {
    /// Charged now (v1 `memory.usage_in_bytes`, v2 `memory.current`).
    pub usage: u64,
    /// The limit (`None`: unlimited).
    pub limit: Option<u64>,
}

/// Reads what the memory cgroup in `dir` uses (v1 or v2 files).
pub fn memory_use(dir: &Path) -> Result<MemoryUse> {
    let read = |name: &str| {
        read_trimmed(dir.join(name))
            .map_err(|e| Error::os(format!("reading {}", dir.join(name).display()), e))
    };
    let (usage, limit) = if dir.join("memory.usage_in_bytes").exists() {
        (
            read("memory.usage_in_bytes")?,
            read("memory.limit_in_bytes")?,
        )
    } else {
        (read("memory.current")?, read("memory.max")?)
    };
    let usage = usage.parse().map_err(|_| Error::MissingField {
        file: dir.display().to_string(),
        field: "byte count",
    })?;
    // v1 says "unlimited" with a page-rounded i64::MAX.
    let limit = limit.parse::<u64>().ok().filter(|l| *l < 1 << 62);
    Ok(MemoryUse { usage, limit })
}

/// A memory cgroup made for a run: created under the calling process's own
/// memory cgroup (so any limit above still holds) with a limit, removed
/// when dropped (after killing what is left in it).
#[derive(Debug)]
pub struct MemoryCgroup {
    dir: PathBuf,
}

impl MemoryCgroup {
    /// Creates the group `name` with a limit of `limit` bytes.
    pub fn create(name: &str, limit: u64) -> Result<MemoryCgroup> {
        let parent = memory_cgroup_dir(None)?.ok_or_else(|| Error::Unsupported {
            feature: "memory cgroup",
            why: "no cgroup v1 memory hierarchy is mounted and no cgroup v2 group with the memory controller".into(),
        })?;
        let dir = parent.join(name);
        std::fs::create_dir(&dir)
            .map_err(|e| Error::os(format!("creating the cgroup {}", dir.display()), e))?;
        let g = MemoryCgroup { dir };
        g.set_limit(limit)?;
        Ok(g)
    }

    /// Sets the group's limit to `limit` bytes (the kernel reclaims what
    /// is charged above it first: swaps, or refuses with `EBUSY`).
    pub fn set_limit(&self, limit: u64) -> Result<()> {
        let file = if self.dir.join("memory.limit_in_bytes").exists() {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        };
        self.write(file, &limit.to_string())
    }

    fn write(&self, file: &str, value: &str) -> Result<()> {
        let p = self.dir.join(file);
        std::fs::write(&p, value).map_err(|e| Error::os(format!("writing {}", p.display()), e))
    }

    /// Moves process `pid` into the group (its memory charged from then on).
    pub fn add(&self, pid: i32) -> Result<()> {
        self.write("cgroup.procs", &pid.to_string())
    }

    /// The group's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What it uses now.
    pub fn usage(&self) -> Result<MemoryUse> {
        memory_use(&self.dir)
    }

    /// Processes the kernel's OOM killer killed in it (v1 `oom_kill` in
    /// `memory.oom_control`, v2 `oom_kill` in `memory.events`).
    pub fn oom_kills(&self) -> u64 {
        ["memory.oom_control", "memory.events"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.join(f)).ok())
            .find_map(|t| {
                t.lines().find_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    (k == "oom_kill").then(|| v.trim().parse().ok())?
                })
            })
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            let pids: Vec<i32> = procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect();
            if pids.is_empty() {
                break;
            }
            for p in pids {
                let _ = pagewise_sys::process::kill(p, libc::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!(
                "pagewise: could not remove the cgroup {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// Swap on a RAM-backed, compressed block device (`/dev/zram0`) for the
/// length of a run: sized, formatted and switched on by [`ZramSwap::setup`],
/// switched off and reset when dropped. Refused, with the reason, where
/// zram is missing, the caller is not root, or the device is already in use.
#[derive(Debug)]
pub struct ZramSwap {
    dev: &'static str,
}

impl ZramSwap {
    const SYS: &'static str = "/sys/block/zram0";

    /// Swap of `bytes` (uncompressed) on `/dev/zram0`.
    pub fn setup(bytes: u64) -> Result<ZramSwap> {
        let refused = |why: String| Error::Unsupported {
            feature: "zram swap",
            why,
        };
        if pagewise_sys::process::geteuid() != 0 {
            return Err(refused("needs root to set up zram swap".into()));
        }
        if !Path::new(Self::SYS).exists() {
            return Err(refused(
                "no /sys/block/zram0 (zram not built in, or its module not loaded)".into(),
            ));
        }
        let swaps = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
        if swaps.contains("/dev/zram0") {
            return Err(Error::DeviceBusy {
                device: "/dev/zram0",
                use_: "in use as swap",
            });
        }
        if read_trimmed(format!("{}/disksize", Self::SYS)).unwrap_or_default() != "0" {
            return Err(Error::DeviceBusy {
                device: "/dev/zram0",
                use_: "initialised by someone else",
            });
        }
        std::fs::write(format!("{}/disksize", Self::SYS), bytes.to_string())
            .map_err(|e| Error::os("sizing /dev/zram0", e))?;
        // From here on, dropping `me` resets the device.
        let me = ZramSwap { dev: "/dev/zram0" };
        for (cmd, args) in [("mkswap", [me.dev, "-q"]), ("swapon", [me.dev, "-p0"])] {
            let out = std::process::Command::new(cmd)
                .args(args)
                .output()
                .map_err(|e| Error::os(format!("running {cmd}"), e))?;
            if !out.status.success() {
                return Err(refused(format!(
                    "{cmd} {}: {}",
                    me.dev,
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
        }
        Ok(me)
    }

    /// Bytes swapped out to it now (`/proc/swaps`).
    pub fn used(&self) -> u64 {
        std::fs::read_to_string("/proc/swaps")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with(self.dev))
            .and_then(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
            .map_or(0, |kib| kib << 10)
    }
}

impl Drop for ZramSwap {
    fn drop(&mut self) {
        let off = std::process::Command::new("swapoff").arg(self.dev).status();
        if !off.is_ok_and(|s| s.success()) {
            eprintln!("pagewise: could not switch off swap on {}", self.dev);
        }
        let _ = std::fs::write(format!("{}/reset", Self::SYS), "1");
    }
}

/// How full memory is, 0 to 1: the memory cgroup of `pid` against its
/// limit where it has one, otherwise the machine (`MemTotal` less
/// `MemAvailable`, of `MemTotal`). Returns the share and what was read.
pub fn memory_utilisation(pid: Option<i32>) -> Result<(f64, String)> {
    utilisation_in(memory_cgroup_dir(pid)?.as_deref())
}

/// [`memory_utilisation`] read again and again (an agent's every step):
/// the process's memory cgroup is found at the first read and kept, and
/// found again every [`Utilisation::FIND_EVERY`] reads or for another
/// process, instead of reading its cgroup file and the mount table (long,
/// on a node with many containers) at each.
#[derive(Debug, Default)]
pub struct Utilisation {
    found: Option<(Option<i32>, Option<PathBuf>)>,
    reads: u64,
}

impl Utilisation {
    /// Reads between two finds of the same process's cgroup (it may have
    /// been moved to another).
    pub const FIND_EVERY: u64 = 30;

    /// [`memory_utilisation`] of `pid`.
    pub fn read(&mut self, pid: Option<i32>) -> Result<(f64, String)> {
        let stale = self.reads.is_multiple_of(Self::FIND_EVERY);
        self.reads += 1;
        let dir = match self.found.take() {
            Some((p, dir)) if p == pid && !stale => dir,
            _ => memory_cgroup_dir(pid)?,
        };
        let dir = &self.found.insert((pid, dir)).1;
        utilisation_in(dir.as_deref())
    }
}

/// [`memory_utilisation`] of the memory cgroup `dir` where it has a
/// limit, else of the machine.
fn utilisation_in(dir: Option<&Path>) -> Result<(f64, String)> {
    if let Some(dir) = dir {
        let u = memory_use(dir)?;
        if let Some(l) = u.limit.filter(|&l| l > 0) {
            return Ok((
                (u.usage as f64 / l as f64).min(1.0),
                format!("cgroup {} MiB of its {} MiB limit", u.usage >> 20, l >> 20),
            ));
        }
    }
    let t = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| Error::os("reading /proc/meminfo", e))?;
    let total = status_field(&t, "MemTotal").unwrap_or(0);
    let avail = status_field(&t, "MemAvailable").unwrap_or(total);
    if total == 0 {
        return Err(Error::MissingField {
            file: "/proc/meminfo".into(),
            field: "MemTotal",
        });
    }
    Ok((
        (total.saturating_sub(avail)) as f64 / total as f64,
        format!(
            "{} MiB of {} MiB in use",
            (total - avail.min(total)) >> 10,
            total >> 10
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Read again and again, the kept cgroup gives what a fresh read does:
    /// the same source, a share between 0 and 1.
    #[test]
    fn utilisation_kept_reads_as_a_fresh_one() {
        let me = Some(std::process::id() as i32);
        let mut kept = Utilisation::default();
        for _ in 0..Utilisation::FIND_EVERY + 2 {
            let (share, of) = kept.read(me).unwrap();
            let (_, fresh) = memory_utilisation(me).unwrap();
            assert!((0.0..=1.0).contains(&share), "{share}");
            // The source is said without its figures, which move between
            // two reads (the host's memory in use, say).
            let source = |s: &str| s.replace(|c: char| c.is_ascii_digit(), "");
            assert_eq!(source(&of), source(&fresh), "{of} against {fresh}");
        }
        let (_, of) = kept.read(me).unwrap();
        println!("ok   {of}, as a fresh read says");
    }
}
