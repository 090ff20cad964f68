//! System-wide settings (`/sys/kernel/mm/ksm/run`, khugepaged's
//! `max_ptes_none`, THP's `enabled`, a `vm` sysctl …) changed under a
//! journal, so that the machine gets them back however pagewise ends.
//!
//! - **Journaled first.** Before a setting is changed, its original value is
//!   written (and synced) to a journal file of its own under
//!   `/run/pagewise/settings/` (owner-only; `PAGEWISE_RUN_DIR` moves it),
//!   which the owner holds locked (`flock`) for as long as it keeps the
//!   setting. The kernel releases the lock when the owner dies, however it
//!   dies (a pid can be reused; a lock cannot outlive its holder).
//! - **Repaired by the next run.** Any later claim of a setting, and every
//!   `pagewise` command at its start ([`recover`]), finds the journals whose
//!   lock is free — their owner is gone without putting the setting back
//!   (SIGKILL) — writes the original back, removes the journal and says so.
//! - **One owner at a time.** A setting another live process holds is
//!   refused ([`Error::SettingHeld`], naming the owner); within one process a
//!   second claim waits for the first to end (at most a minute).
//! - **Put back when dropped**, also on an error path, and by the agents on
//!   SIGINT/SIGTERM (they end normally).
//!
//! The same holds for advice an agent gives inside a process (dedup's
//! advice journal, below, kept with [`orphans`] and [`open_journal`]).
//!
//! Journal format, version 1 (text, at most 64 KiB read):
//! `pagewise-setting 1\npath=<setting>\nold=<value>\npid=<owner>\ncmd=<owner's name>\n`.

use crate::procfs;
use crate::{Error, Holder, Result};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

const HEADER: &str = "pagewise-setting 1";
/// Most bytes of a journal read.
pub const MAX_JOURNAL: u64 = 64 << 10;

/// Settings this process holds (their paths), for claims that wait.
static HELD: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static RELEASED: Condvar = Condvar::new();

/// The journal directory (`/run/pagewise/settings`, or
/// `$PAGEWISE_RUN_DIR/settings`).
pub fn journal_dir() -> PathBuf {
    std::env::var_os("PAGEWISE_RUN_DIR")
        .map_or_else(|| PathBuf::from("/run/pagewise"), PathBuf::from)
        .join("settings")
}

/// The journal file of setting `path`.
fn journal_of(path: &Path) -> PathBuf {
    let name: String = path
        .to_string_lossy()
        .chars()
        .map(|c| if c == '/' { '%' } else { c })
        .collect();
    journal_dir().join(name)
}

/// A journal's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Journal {
    path: PathBuf,
    old: String,
    pid: i32,
    cmd: String,
}

impl Journal {
    fn encode(&self) -> String {
        format!(
            "{HEADER}\npath={}\nold={}\npid={}\ncmd={}\n",
            self.path.display(),
            self.old,
            self.pid,
            self.cmd
        )
    }

    /// Parses a journal; `None` if it is not one.
    fn decode(text: &str) -> Option<Journal> {
        let mut lines = text.lines();
        if lines.next()? != HEADER {
            return None;
        }
        let mut field = |k: &str| {
            lines
                .next()?
                .strip_prefix(k)?
                .strip_prefix('=')
                .map(str::to_string)
        };
        Some(Journal {
            path: PathBuf::from(field("path")?),
            old: field("old")?,
            pid: field("pid")?.parse().ok()?,
            cmd: field("cmd")?,
        })
    }
}

/// Opens (creating) journal file `j`, owner-only, never through a link.
pub fn open_journal(j: &Path) -> Result<File> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let dir = j.parent().expect("a journal lies in the journal directory");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| match e.raw_os_error() {
            // Not root: say what the work needs, not which file failed.
            Some(libc::EACCES | libc::EPERM) => Error::NeedsRoot {
                setting: j
                    .file_name()
                    .map_or_else(String::new, |n| n.to_string_lossy().replace('%', "/")),
                journal: dir.to_path_buf(),
            },
            _ => Error::os(format!("creating {}", dir.display()), e),
        })?;
    let f = crate::files::open_lock_file(j)
        .map_err(|e| Error::os(format!("opening {}", j.display()), e))?;
    let md = f
        .metadata()
        .map_err(|e| Error::os(format!("reading {}", j.display()), e))?;
    if !md.is_file() || md.uid() != pagewise_sys::process::geteuid() {
        return Err(Error::NotAJournal {
            path: j.to_path_buf(),
        });
    }
    Ok(f)
}

/// Whether `f` (locked) is still the file at `j` (not one unlinked by the
/// owner that just let go of it).
fn still_linked(f: &File, j: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (f.metadata(), std::fs::symlink_metadata(j)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    }
}

fn read_journal(f: &mut File) -> Option<Journal> {
    let mut text = String::new();
    f.rewind().ok()?;
    f.take(MAX_JOURNAL).read_to_string(&mut text).ok()?;
    Journal::decode(&text)
}

/// Writes `value` to setting `path`.
fn write_setting(path: &Path, value: &str) -> std::io::Result<()> {
    std::fs::write(path, value)
}

/// The current value of setting `path` (the selected one of a
/// `[bracketed]` choice list, such as THP's `always [madvise] never`).
pub fn current(path: impl AsRef<Path>) -> std::io::Result<String> {
    let raw = std::fs::read_to_string(path)?;
    Ok(procfs::bracketed_choice(&raw)
        .map(str::to_string)
        .unwrap_or_else(|| raw.trim().to_string()))
}

/// Puts back every setting whose journal's owner is gone (see the module);
/// what was put back, one line each (also said on stderr). Journals of
/// live owners are left alone.
pub fn recover() -> Vec<String> {
    let mut said = Vec::new();
    for (j, mut f) in orphans(&journal_dir()) {
        if let Some(line) = repair(&mut f, &j) {
            eprintln!("pagewise: {line}");
            said.push(line);
        }
    }
    said
}

/// Puts back every setting this process holds, now: for a program ending
/// on a signal it took, which will not run its guards' drops. What was put
/// back, one line each.
pub fn put_back_own() -> Vec<String> {
    let me = std::process::id() as i32;
    let Ok(rd) = std::fs::read_dir(journal_dir()) else {
        return Vec::new();
    };
    let mut said = Vec::new();
    for j in rd.flatten().map(|e| e.path()) {
        let Ok(mut f) = open_journal(&j) else {
            continue;
        };
        let Some(jn) = read_journal(&mut f) else {
            continue;
        };
        if jn.pid != me {
            continue;
        }
        match write_setting(&jn.path, &jn.old) {
            Ok(()) => {
                let _ = std::fs::remove_file(&j);
                said.push(format!("{} put back to {:?}", jn.path.display(), jn.old));
            }
            Err(e) => eprintln!(
                "pagewise: could not put {} back to {:?}: {e}",
                jn.path.display(),
                jn.old
            ),
        }
    }
    said
}

/// The journals in `dir` whose owner is gone, each opened and locked (a
/// journal a live owner holds is left alone, as is one its owner unlinked
/// meanwhile).
pub fn orphans(dir: &Path) -> Vec<(PathBuf, File)> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| {
            let j = e.path();
            let f = open_journal(&j).ok()?;
            (pagewise_sys::process::flock_exclusive_nonblocking(f.as_fd()).is_ok()
                && still_linked(&f, &j))
            .then_some((j, f))
        })
        .collect()
}

/// With the lock of journal `j` held and its owner gone: writes the
/// original back and removes the journal. What was done, if anything.
fn repair(f: &mut File, j: &Path) -> Option<String> {
    let journal = read_journal(f);
    let line = match journal {
        Some(jn) => {
            let now = current(&jn.path).unwrap_or_default();
            match write_setting(&jn.path, &jn.old) {
                Ok(()) => Some(format!(
                    "{} was left at {now:?} by pagewise process {} ({}), which ended without \
                     putting it back: put back to {:?}",
                    jn.path.display(),
                    jn.pid,
                    jn.cmd,
                    jn.old
                )),
                Err(e) => {
                    // Keep the journal: a later run may manage.
                    eprintln!(
                        "pagewise: could not put {} back to {:?}: {e}",
                        jn.path.display(),
                        jn.old
                    );
                    return None;
                }
            }
        }
        // Empty (its owner died before writing it) or not a journal.
        None => None,
    };
    let _ = std::fs::remove_file(j);
    line
}

/// Waits (`within` at most) until no other pagewise process holds setting
/// `path`; `Err` with what [`SettingGuard::claim`] said (which process
/// holds it) when one still does. Other errors are left to the claim that
/// follows. The setting is not changed (taken and given back at once).
pub fn wait_until_free(path: impl AsRef<Path>, within: std::time::Duration) -> Result<()> {
    let t0 = std::time::Instant::now();
    loop {
        match SettingGuard::claim(path.as_ref()) {
            Err(e @ Error::SettingHeld { .. }) => {
                if t0.elapsed() >= within {
                    return Err(e);
                }
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            _ => return Ok(()),
        }
    }
}

/// One system-wide setting, held by this process: the original value is
/// journaled, and written back when the guard is dropped.
#[derive(Debug)]
pub struct SettingGuard {
    path: PathBuf,
    old: String,
    journal: PathBuf,
    _lock: File,
}

impl SettingGuard {
    /// Takes setting `path` (see the module) without changing it yet.
    pub fn claim(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        recover();
        // One claim at a time within this process.
        {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
            while held.contains(&path) {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::SettingHeld {
                        setting: path,
                        holder: Holder::ThisProcess,
                    });
                }
                held = RELEASED
                    .wait_timeout(held, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            held.push(path.clone());
        }
        let r = Self::claim_journaled(&path);
        if r.is_err() {
            Self::release(&path);
        }
        r
    }

    fn claim_journaled(path: &Path) -> Result<Self> {
        let j = journal_of(path);
        for _ in 0..8 {
            let mut f = open_journal(&j)?;
            if let Err(e) = pagewise_sys::process::flock_exclusive_nonblocking(f.as_fd()) {
                if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(Error::os(format!("locking {}", j.display()), e));
                }
                let holder = read_journal(&mut f).map_or(Holder::Unknown, |o| Holder::Pagewise {
                    pid: o.pid,
                    cmd: o.cmd,
                });
                return Err(Error::SettingHeld {
                    setting: path.to_path_buf(),
                    holder,
                });
            }
            if !still_linked(&f, &j) {
                continue; // its owner let go meanwhile: the next file
            }
            // A journal left by an owner that is gone: put it back first.
            if f.metadata().map(|m| m.len()).unwrap_or(0) > 0 {
                if let Some(line) = repair(&mut f, &j) {
                    eprintln!("pagewise: {line}");
                }
                continue;
            }
            let old =
                current(path).map_err(|e| Error::os(format!("reading {}", path.display()), e))?;
            let me = Journal {
                path: path.to_path_buf(),
                old: old.clone(),
                pid: std::process::id() as i32,
                cmd: std::fs::read_to_string("/proc/self/comm")
                    .map(|c| c.trim().to_string())
                    .unwrap_or_default(),
            };
            f.write_all(me.encode().as_bytes())
                .and_then(|()| f.sync_all())
                .map_err(|e| Error::os(format!("writing {}", j.display()), e))?;
            return Ok(SettingGuard {
                path: path.to_path_buf(),
                old,
                journal: j,
                _lock: f,
            });
        }
        Err(Error::SettingHeld {
            setting: path.to_path_buf(),
            holder: Holder::Churning,
        })
    }

    fn release(path: &Path) {
        let mut held = HELD.lock().unwrap_or_else(|e| e.into_inner());
        held.retain(|p| p != path);
        RELEASED.notify_all();
    }

    /// Claims setting `path` and writes `value` to it.
    pub fn set(path: impl AsRef<Path>, value: &str) -> Result<Self> {
        let g = Self::claim(path)?;
        g.write(value)?;
        Ok(g)
    }

    /// Writes `value` to the setting (the journal keeps the original).
    pub fn write(&self, value: &str) -> Result<()> {
        write_setting(&self.path, value)
            .map_err(|e| Error::os(format!("writing {:?} to {}", value, self.path.display()), e))
    }

    /// The value the setting had before.
    pub fn old(&self) -> &str {
        &self.old
    }

    /// The setting's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Settings put back since the last [`take_put_back`], as `path=value`.
static PUT_BACK: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

/// The settings put back (each `path=value`, in order) since the last
/// call: what a command says at its end.
pub fn take_put_back() -> Vec<String> {
    std::mem::take(&mut *PUT_BACK.lock().unwrap_or_else(|e| e.into_inner()))
}

impl Drop for SettingGuard {
    fn drop(&mut self) {
        match write_setting(&self.path, &self.old) {
            Ok(()) => {
                let _ = std::fs::remove_file(&self.journal);
                PUT_BACK
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(format!("{}={}", self.path.display(), self.old.trim()));
            }
            // The journal stays: the next run puts it back.
            Err(e) => eprintln!(
                "pagewise: could not restore {} to {:?}: {e}",
                self.path.display(),
                self.old
            ),
        }
        Self::release(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journals_round_trip_and_garbage_is_none() {
        let j = Journal {
            path: "/sys/kernel/mm/ksm/run".into(),
            old: "0".into(),
            pid: 42,
            cmd: "pagewise".into(),
        };
        assert_eq!(Journal::decode(&j.encode()), Some(j));
        for bad in [
            "",
            "pagewise-setting 2\n",
            "pagewise-setting 1\npath=x\n",
            "\u{0}",
        ] {
            assert_eq!(Journal::decode(bad), None, "{bad:?}");
        }
    }
}
