//! Freezing a cgroup, so that a group of processes (a container) can be
//! stopped at one instant: while the cgroup is frozen no process of it
//! runs, forks or exits, so the list of its processes is complete and
//! every thread can be seized and interrupted before any of them runs
//! again (CRIU does the same). The freezer is cgroup v2's `cgroup.freeze`
//! or, on a v1 (or hybrid) hierarchy, the `freezer` controller's
//! `freezer.state`.
//!
//! Freezing is a setting of the system: it is journaled first and put
//! back (thawed) when the guard is dropped, on an error path too, or by
//! the next pagewise run if this one was killed meanwhile
//! ([`crate::settings`]). A cgroup frozen by someone else (`podman
//! pause`) is not taken: it is refused, and left frozen.

use crate::error::Refusal;
use crate::settings::SettingGuard;
use crate::Result;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The freezer of one cgroup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Freezer {
    /// Its cgroup's directory.
    dir: PathBuf,
    /// Whether it is cgroup v2's (`cgroup.freeze`), not v1's.
    v2: bool,
}

/// A frozen cgroup, thawed when dropped.
#[derive(Debug)]
pub struct Frozen {
    _state: SettingGuard,
    dir: PathBuf,
}

impl Frozen {
    /// The frozen cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Which line of `/proc/PID/cgroup` (by its controllers) is a hierarchy's.
type LineOf = fn(&str) -> bool;

/// The path of process `pid`'s cgroup in the hierarchy whose controllers
/// `want` picks, from `/proc/PID/cgroup`.
fn path_in(pid: i32, want: LineOf) -> Option<String> {
    crate::container::cgroup_paths(pid)
        .ok()?
        .into_iter()
        .find(|(ctrl, _)| want(ctrl))
        .map(|(_, p)| p)
}

/// Every process of the cgroup at `dir` and its sub-cgroups.
fn procs_below(dir: &Path, out: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        out.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                procs_below(&e.path(), out);
            }
        }
    }
}

impl Freezer {
    /// The freezer that stops exactly the processes `pids` (the cgroup
    /// they all are in, which holds no other process, sub-cgroups
    /// included): v1's `freezer` hierarchy where it is mounted, otherwise
    /// v2's `cgroup.freeze`. `None` where there is none: the processes are
    /// in different cgroups, or share theirs with others (the root, a
    /// session's), or the kernel has no freezer.
    pub fn holding_exactly(pids: &[i32]) -> Option<Freezer> {
        let first = *pids.first()?;
        let v1: LineOf = |c| c.split(',').any(|c| c == "freezer");
        let v2: LineOf = str::is_empty;
        // (v2, which line of /proc/PID/cgroup, the hierarchy's mount)
        let candidates = [
            (false, v1, "/sys/fs/cgroup/freezer"),
            (true, v2, "/sys/fs/cgroup/unified"),
            (true, v2, "/sys/fs/cgroup"),
        ];
        for (v2, want, root) in candidates {
            let Some(path) = path_in(first, want) else {
                continue;
            };
            if path == "/"
                || pids
                    .iter()
                    .any(|&p| path_in(p, want).as_ref() != Some(&path))
            {
                continue;
            }
            let dir = Path::new(root).join(path.trim_start_matches('/'));
            let state = dir.join(if v2 { "cgroup.freeze" } else { "freezer.state" });
            if !state.is_file() {
                continue;
            }
            let mut inside = Vec::new();
            procs_below(&dir, &mut inside);
            if inside.iter().all(|p| pids.contains(p)) {
                return Some(Freezer { dir, v2 });
            }
        }
        None
    }

    /// The cgroup's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the cgroup is frozen now (by anyone).
    pub fn is_frozen(&self) -> bool {
        if self.v2 {
            std::fs::read_to_string(self.dir.join("cgroup.events"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "frozen 1"))
        } else {
            std::fs::read_to_string(self.dir.join("freezer.state"))
                .is_ok_and(|t| t.trim() == "FROZEN")
        }
    }

    /// Freezes the cgroup and waits (at most `limit`) until every process
    /// of it is frozen; thawed when the guard is dropped. Refused for a
    /// cgroup someone else froze.
    pub fn freeze(&self, limit: Duration) -> Result<Frozen> {
        let (file, on) = if self.v2 {
            ("cgroup.freeze", "1")
        } else {
            ("freezer.state", "FROZEN")
        };
        let state = self.dir.join(file);
        let guard = SettingGuard::claim(&state)?;
        if guard.old() != "THAWED" && guard.old() != "0" {
            return Err(Refusal::FrozenAlready {
                dir: self.dir.clone(),
                file,
                state: guard.old().trim().to_string(),
            }
            .into());
        }
        guard.write(on)?;
        let deadline = Instant::now() + limit;
        while !self.is_frozen() {
            if Instant::now() > deadline {
                return Err(Refusal::NotFreezing {
                    dir: self.dir.clone(),
                    ms: limit.as_millis() as u64,
                }
                .into());
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(Frozen {
            _state: guard,
            dir: self.dir.clone(),
        })
    }
}
