//! The advice the dedup agent gives inside a process (`MADV_MERGEABLE`
//! on the regions it merges), journaled so that it is taken back
//! (`MADV_UNMERGEABLE`) if the agent dies first: by the next `pagewise`
//! command ([`recover_advice`], which `agent::settings::recover` runs),
//! while the same process (its pid and start time) runs. The journals sit
//! beside the settings' (`/run/pagewise/advice/`) and are held as theirs
//! are (`pagewise_mech::settings`): locked while their agent lives, an
//! orphan's lock free.

use pagewise_mech::settings::{journal_dir, open_journal, orphans, MAX_JOURNAL};
use pagewise_mech::{procfs, Error, Result};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::fd::AsFd;
use std::path::PathBuf;

/// The directory of advice journals.
fn advice_dir() -> PathBuf {
    journal_dir().with_file_name("advice")
}

const ADVICE_HEADER: &str = "pagewise-advice 1";
/// Most ranges read back from one advice journal.
const MAX_ADVICE_RANGES: usize = 1 << 16;

/// Advice an agent gave inside process `pid` (`madvise(advice)` on
/// ranges), journaled so that it is taken back (`undo`) if the agent dies
/// first: by the next `pagewise` command, while the same process runs.
/// Format, version 1: `pagewise-advice 1\npid=P\nstart=TICKS\nundo=ADVICE\n`
/// then one `START LEN` line (hexadecimal) per range.
#[derive(Debug)]
pub struct AdviceJournal {
    path: PathBuf,
    file: File,
    head: String,
    ranges: std::collections::BTreeMap<u64, u64>,
}

impl AdviceJournal {
    /// A journal of advice given in process `pid`, undone with `undo`.
    pub fn new(pid: i32, undo: i32) -> Result<Self> {
        recover_advice();
        pagewise_mech::settings::recover();
        let start = procfs::start_time(pid).ok_or(Error::NoSuchProcess(pid))?;
        let path = advice_dir().join(format!("{pid}.{}", std::process::id()));
        let file = open_journal(&path)?;
        pagewise_sys::process::flock_exclusive_nonblocking(file.as_fd())
            .map_err(|e| Error::os(format!("locking {}", path.display()), e))?;
        let j = AdviceJournal {
            path,
            file,
            head: format!("{ADVICE_HEADER}\npid={pid}\nstart={start}\nundo={undo}\n"),
            ranges: Default::default(),
        };
        j.write()?;
        Ok(j)
    }

    fn write(&self) -> Result<()> {
        use std::fmt::Write as _;
        let mut text = self.head.clone();
        for (s, n) in &self.ranges {
            let _ = writeln!(text, "{s:x} {n:x}");
        }
        let mut f = &self.file;
        f.set_len(0)
            .and_then(|()| f.rewind())
            .and_then(|()| f.write_all(text.as_bytes()))
            .and_then(|()| f.sync_data())
            .map_err(|e| Error::os(format!("writing {}", self.path.display()), e))
    }

    /// Notes `ranges` before the advice is given on them.
    pub fn record_advice(&mut self, ranges: &[(u64, u64)]) -> Result<()> {
        let mut changed = false;
        for &(s, n) in ranges {
            changed |= self.ranges.insert(s, n) != Some(n);
        }
        if changed {
            self.write()?;
        }
        Ok(())
    }

    /// Notes `ranges` taken back (undone by the agent itself).
    pub fn taken_back(&mut self, ranges: &[(u64, u64)]) -> Result<()> {
        let mut changed = false;
        for (s, _) in ranges {
            changed |= self.ranges.remove(s).is_some();
        }
        if changed {
            self.write()?;
        }
        Ok(())
    }
}

impl Drop for AdviceJournal {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Takes back the advice of agents that died (see the module);
/// what was done, one line each (also said on stderr).
pub fn recover_advice() -> Vec<String> {
    let mut said = Vec::new();
    for (j, mut f) in orphans(&advice_dir()) {
        let mut text = String::new();
        let _ = f.rewind();
        let _ = (&mut f).take(MAX_JOURNAL * 16).read_to_string(&mut text);
        let mut lines = text.lines();
        let head = (lines.next() == Some(ADVICE_HEADER))
            .then(|| {
                let mut field = |k: &str| -> Option<u64> {
                    lines
                        .next()?
                        .strip_prefix(k)?
                        .strip_prefix('=')?
                        .parse()
                        .ok()
                };
                Some((field("pid")?, field("start")?, field("undo")?))
            })
            .flatten();
        let ranges: Vec<(u64, u64)> = lines
            .take(MAX_ADVICE_RANGES)
            .filter_map(|l| {
                let (a, b) = l.split_once(' ')?;
                let (a, b) = (
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                );
                pagewise_mech::Region::new(a, b).ok().map(|_| (a, b))
            })
            .collect();
        if let Some((pid, start, undo)) = head {
            let pid = i32::try_from(pid).unwrap_or(-1);
            let same = pid > 0 && procfs::start_time(pid) == Some(start);
            if same && !ranges.is_empty() {
                let line = match pagewise_mech::inject::madvise_in(
                    pid,
                    &ranges,
                    undo as i32,
                    "recovery",
                ) {
                    Ok(_) => format!(
                        "took back the advice a pagewise agent that ended without doing so had \
                         given in process {pid} ({} ranges)",
                        ranges.len()
                    ),
                    Err(e) => format!(
                        "could not take back the advice a pagewise agent left in process {pid}: {e}"
                    ),
                };
                eprintln!("pagewise: {line}");
                said.push(line);
            }
        }
        let _ = std::fs::remove_file(&j);
    }
    said
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advice_journal_holds_the_ranges_given_and_not_taken_back() {
        let mut j = AdviceJournal::new(std::process::id() as i32, libc::MADV_UNMERGEABLE)
            .expect("an advice journal for this process");
        let ranges = |j: &AdviceJournal| -> Vec<String> {
            let text = std::fs::read_to_string(&j.path).unwrap();
            text.lines().skip(4).map(str::to_string).collect()
        };
        j.record_advice(&[(0x1000, 0x2000), (0x8000, 0x1000)])
            .unwrap();
        j.record_advice(&[(0x1000, 0x2000)]).unwrap();
        assert_eq!(ranges(&j), ["1000 2000", "8000 1000"]);
        j.taken_back(&[(0x1000, 0x2000)]).unwrap();
        j.taken_back(&[(0x1000, 0x2000), (0x5000, 0x1000)]).unwrap();
        assert_eq!(ranges(&j), ["8000 1000"]);
        j.record_advice(&[(0x8000, 0x3000)]).unwrap();
        assert_eq!(ranges(&j), ["8000 3000"]);
        let path = j.path.clone();
        drop(j);
        assert!(!path.exists(), "the journal outlived its agent");
    }
}
