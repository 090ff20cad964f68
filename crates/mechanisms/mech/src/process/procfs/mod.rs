//! Reading `/proc` and `/sys`: the one place pagewise parses them.
//! Memory cgroups and swap set up for a run are in [`crate::cgroup`]; system
//! settings changed and put back in [`crate::settings`].

use crate::{Error, Region, Result};

mod fds;
mod maps;
pub use fds::{descriptors, fd_kind, held_elsewhere, parse_fdinfo, tcp_owner, Descriptor, FdKind};
pub use maps::{
    maps, note_own_memory, outside_ranges, own_memory, parse_maps, writable, writable_anonymous,
    Mapping, MemoryKind, MAX_OWN, OWN_MAPPING_PREFIX, OWN_THREAD_STACK, STAGING_NAME,
};
pub(crate) use maps::{writable_anonymous_of, MapsFile};
use std::path::{Path, PathBuf};

/// `/proc/PID` or `/proc/self`.
pub fn proc_dir(pid: Option<i32>) -> PathBuf {
    match pid {
        Some(p) => PathBuf::from(format!("/proc/{p}")),
        None => PathBuf::from("/proc/self"),
    }
}

/// The thread ids of process `pid`.
pub fn tasks(pid: i32) -> Result<Vec<i32>> {
    let dir = proc_dir(Some(pid)).join("task");
    let mut out = Vec::new();
    for e in std::fs::read_dir(&dir)
        .map_err(|e| Error::for_pid(pid, format!("reading {}", dir.display()), e))?
    {
        let e = e.map_err(|e| Error::for_pid(pid, format!("reading {}", dir.display()), e))?;
        if let Ok(tid) = e.file_name().to_string_lossy().parse() {
            out.push(tid);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The children of every thread of process `pid` (`/proc/PID/task/*/children`);
/// `None` where the kernel does not list them.
pub fn children(pid: i32) -> Option<Vec<i32>> {
    let mut out = Vec::new();
    for tid in tasks(pid).ok()? {
        let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/children")).ok()?;
        out.extend(
            text.split_whitespace()
                .filter_map(|c| c.parse::<i32>().ok()),
        );
    }
    out.sort_unstable();
    out.dedup();
    Some(out)
}

/// The descriptors process `pid` has open (`/proc/PID/fd`), sorted; none
/// where they cannot be listed.
pub fn open_fds(pid: i32) -> Vec<i64> {
    let mut v: Vec<i64> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort_unstable();
    v
}

/// The parent of process `pid` (field 4 of `/proc/PID/stat`).
pub fn parent(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Checks that `pid` names a process whose memory pagewise can work on:
/// one that exists (a positive pid, not a zombie) and is not a kernel
/// thread (which has no user memory). One clear error otherwise.
pub fn check_target(pid: i32) -> Result<()> {
    if pid <= 0 || !is_alive(pid) {
        return Err(Error::NoSuchProcess(pid));
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Err(Error::NoSuchProcess(pid));
    };
    // Field 9 (the flags) follows the parenthesised command name.
    const PF_KTHREAD: u64 = 0x0020_0000;
    let comm = stat
        .find('(')
        .zip(stat.rfind(')'))
        .map_or("", |(a, b)| &stat[a + 1..b]);
    let flags = stat_field(&stat, 9).unwrap_or(0);
    if flags & PF_KTHREAD != 0 {
        return Err(Error::KernelThread {
            pid,
            comm: comm.to_string(),
        });
    }
    Ok(())
}

/// The mappings of `pid` (`None`: this process) whose missing or minor
/// faults a userfaultfd serves (`VmFlags` `um` or `ui` in smaps), as
/// `(start, end)`: reading a page of one that is not there waits for that
/// process's own handler (as under `pagewise farmem run`).
pub fn uffd_served(pid: Option<i32>) -> Result<Vec<(u64, u64)>> {
    with_vm_flag(pid, &["um", "ui"])
}

/// The mappings of `pid` that the program serves the faults of with a
/// userfaultfd of its own, not pagewise's: [`uffd_served`], none where
/// the program runs pagewise's preload shim (whose far-memory engine
/// serves them, and reads of them are its to answer).
pub fn self_served(pid: i32) -> Result<Vec<(u64, u64)>> {
    let shim = maps(Some(pid))?
        .iter()
        .any(|m| m.path.ends_with(crate::shim::SHIM_FILE));
    if shim {
        return Ok(Vec::new());
    }
    uffd_served(Some(pid))
}

/// Whether process `pid` holds a userfaultfd of its own: a descriptor of
/// one in its table that its `UFFDIO_API` has set up, pagewise's preload
/// shim's aside. A program that holds one may register its memory at any
/// time, and the kernel refuses it (`EBUSY`) a mapping another
/// userfaultfd registered first: pagewise registers nothing of such a
/// process. One not set up yet can register nothing; a pagewise killed
/// while it made its own inside the process leaves one such (set up only
/// once taken out), which is not counted.
pub fn owns_userfaultfd(pid: i32) -> bool {
    let dir = proc_dir(Some(pid));
    let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
        return false;
    };
    let holds = fds.flatten().any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]")
            && std::fs::read_to_string(dir.join("fdinfo").join(e.file_name()))
                .is_ok_and(|info| uffd_set_up(&info))
    });
    holds
        && !maps(Some(pid))
            .is_ok_and(|m| m.iter().any(|m| m.path.ends_with(crate::shim::SHIM_FILE)))
}

/// Whether a userfaultfd's fdinfo says its `UFFDIO_API` was made: the
/// features of its `API:` line (`api:features:ioctls`, hex) are not 0
/// (recent kernels set a bit of their own there, `UFFD_FEATURE_INITIALIZED`,
/// whatever the features asked; older ones show only those asked).
fn uffd_set_up(fdinfo: &str) -> bool {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("API:"))
        .and_then(|v| v.trim().split(':').nth(1))
        .and_then(|f| u64::from_str_radix(f, 16).ok())
        .is_some_and(|f| f != 0)
}

/// The mappings of `pid` (`None`: this process) whose smaps `VmFlags` hold
/// any of `flags` (`mg`: KSM may merge it; `hg`: `MADV_HUGEPAGE`; ...), as
/// `(start, end)`.
pub fn with_vm_flag(pid: Option<i32>, flags: &[&str]) -> Result<Vec<(u64, u64)>> {
    let path = proc_dir(pid).join("smaps");
    let text = std::fs::read_to_string(&path).map_err(|e| match pid {
        Some(p) => Error::for_pid(p, format!("reading {}", path.display()), e),
        None => Error::os(format!("reading {}", path.display()), e),
    })?;
    let mut out = Vec::new();
    let mut current = None;
    for line in text.lines() {
        if let Some(have) = line.strip_prefix("VmFlags:") {
            if have.split_whitespace().any(|f| flags.contains(&f)) {
                if let Some(r) = current {
                    out.push(r);
                }
            }
        } else if let Some(m) = parse_maps(line).first() {
            current = Some((m.start, m.end));
        }
    }
    Ok(out)
}

/// Whether process `pid` exists and is not a zombie.
pub fn is_alive(pid: i32) -> bool {
    matches!(process_state(pid), Ok(Some(state)) if !matches!(state.as_str(), "Z" | "X" | "x"))
}

/// Whether process `pid` still has memory (`/proc/PID/statm` counts its
/// pages; a process in `exit` whose memory is gone, or one gone, has
/// none). Cheap whatever the number of mappings, unlike reading its maps.
pub fn has_memory(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/statm")).is_ok_and(|s| {
        s.split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .is_some_and(|pages| pages > 0)
    })
}

/// Whether process `pid` ended or is ending: gone, a zombie, or in `exit`
/// with its memory already released (a process killed while stopped is
/// still `R` or `D` for a while after its mappings are gone).
pub fn is_ending(pid: i32) -> bool {
    !has_memory(pid) || !is_alive(pid)
}

/// The state letter of process `pid` (`/proc/PID/stat`: `R`, `S`, `T`,
/// `Z`, ...); `None` where the line holds none. A plain I/O error (not an
/// [`Error`]: [`Error::for_pid`] itself asks [`is_alive`]).
pub fn process_state(pid: i32) -> std::io::Result<Option<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The state follows the parenthesised command name, which may hold spaces.
    Ok(stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next())
        .map(str::to_string))
}

/// How many threads process `pid` has (`Threads:` in its status: the
/// kernel's own count, exact where a listing of `/proc/PID/task` made while
/// threads end can miss some); threads that are ending count until they
/// are gone.
pub fn thread_count(pid: i32) -> Option<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status_field(&status, "Threads").map(|n| n as usize)
}

/// Whether thread `tid` is ending or gone (a zombie, dead, or no longer
/// there).
pub fn thread_ending(tid: i32) -> bool {
    match process_state(tid) {
        Ok(Some(s)) => s == "Z" || s == "X",
        _ => true,
    }
}

/// Whether thread `tid` is a thread of process `pid` (the kernel finds
/// `/proc/PID/task/TID` only then): a thread id freed by a thread that
/// ended can be taken at once by another process's thread.
pub fn thread_of(pid: i32, tid: i32) -> bool {
    proc_dir(Some(pid))
        .join("task")
        .join(tid.to_string())
        .exists()
}

/// Whether thread `tid` is runnable: running, or waiting for a CPU.
pub fn thread_runnable(tid: i32) -> bool {
    matches!(process_state(tid), Ok(Some(s)) if s == "R")
}

/// Whether thread `tid` is there as a zombie (or dead, not yet
/// released): still counted in its process's `Threads:`, running nothing.
pub fn thread_zombie(tid: i32) -> bool {
    matches!(process_state(tid), Ok(Some(s)) if s == "Z" || s == "X")
}

/// What names the program a process runs, which changes at every `exec`
/// though the pid and start time do not: the address of the 16 random
/// bytes the kernel gave it (`AT_RANDOM`), the bytes themselves, and its
/// entry point (`AT_ENTRY`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecIdentity {
    /// `AT_RANDOM`: where the bytes are.
    pub random_at: u64,
    /// The 16 bytes.
    pub random: [u8; 16],
    /// `AT_ENTRY`.
    pub entry: u64,
}

/// The auxiliary vector's value of `key` in `auxv` (`/proc/PID/auxv`:
/// pairs of native words, up to `AT_NULL`).
pub fn auxv_value(auxv: &[u8], key: u64) -> Option<u64> {
    for pair in auxv.chunks_exact(16) {
        let k = u64::from_ne_bytes(pair[..8].try_into().ok()?);
        let v = u64::from_ne_bytes(pair[8..].try_into().ok()?);
        if k == 0 {
            return None;
        }
        if k == key {
            return Some(v);
        }
    }
    None
}

/// The identity of the program process `pid` runs (see [`ExecIdentity`]);
/// `None` where it cannot be read. The bytes are read through
/// `/proc/PID/mem`, which leaves shared pages shared.
pub fn exec_identity(pid: i32) -> Option<ExecIdentity> {
    use std::os::unix::fs::FileExt;
    let auxv = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    let random_at = auxv_value(&auxv, libc::AT_RANDOM)?;
    let entry = auxv_value(&auxv, libc::AT_ENTRY)?;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut random = [0u8; 16];
    mem.read_exact_at(&mut random, random_at).ok()?;
    Some(ExecIdentity {
        random_at,
        random,
        entry,
    })
}

/// When process `pid` started, in clock ticks since boot (`/proc/PID/stat`
/// field 22): with the pid, it names one process, whose pid may be reused
/// after it ends.
pub fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat_field(&stat, 22)
}

/// Numeric field `n` (from 1, as in `proc(5)`; 3 or later) of a `/proc/PID/stat`
/// text, counted after the last `)` (the name may hold spaces and parentheses).
pub fn stat_field(stat: &str, n: usize) -> Option<u64> {
    let after = n.checked_sub(3)?;
    stat.rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().nth(after))
        .and_then(|f| f.parse().ok())
}

/// Reads a one-line file under `/proc` or `/sys`, trimmed.
pub fn read_trimmed(path: impl AsRef<Path>) -> std::io::Result<String> {
    Ok(std::fs::read_to_string(path)?.trim().to_string())
}

/// The selected value of a `[bracketed]` sysfs choice list such as
/// `always [madvise] never`.
pub fn bracketed_choice(text: &str) -> Option<&str> {
    let s = text.find('[')?;
    let e = text[s..].find(']')? + s;
    Some(&text[s + 1..e])
}

/// Reads one `Key:   value kB` field of `/proc/PID/status` or `/proc/meminfo`, in the file's unit.
/// The key may be given with or without its colon.
pub fn status_field(text: &str, key: &str) -> Option<u64> {
    let key = key.strip_suffix(':').unwrap_or(key);
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.split_whitespace().next()?.parse().ok())?
    })
}

/// Whether this process has capability `cap` (a `CAP_*` number) in its
/// effective set (`CapEff` of `/proc/self/status`); unknown is no.
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|t| status_hex(&t, "CapEff"))
        .is_some_and(|c| cap < 64 && c & (1u64 << cap) != 0)
}

/// Reads one hexadecimal field of `/proc/PID/status`, such as `SigBlk`.
pub fn status_hex(text: &str, key: &str) -> Option<u64> {
    let key = key.strip_suffix(':').unwrap_or(key);
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| u64::from_str_radix(v.trim(), 16).ok())?
    })
}

/// Every number of one field of `/proc/PID/status` that holds several,
/// such as `Uid` (real, effective, saved, file system).
pub fn status_ids(text: &str, key: &str) -> Option<Vec<u32>> {
    let key = key.strip_suffix(':').unwrap_or(key);
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k.trim() == key).then(|| v.split_whitespace().map(|n| n.parse().ok()).collect())?
    })
}

/// A thread's signal sets (`/proc/PID/task/TID/status`; bit `n - 1` for
/// signal `n`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ThreadSignals {
    /// Pending for the thread or for its process (`SigPnd | ShdPnd`).
    pub pending: u64,
    /// Blocked (`SigBlk`).
    pub blocked: u64,
    /// Ignored (`SigIgn`).
    pub ignored: u64,
    /// Caught by a handler (`SigCgt`).
    pub caught: u64,
}

impl ThreadSignals {
    /// Pending and not blocked: what the thread would take on its way back
    /// to user mode.
    pub fn deliverable(&self) -> u64 {
        self.pending & !self.blocked
    }
}

/// The signal sets of thread `tid` of process `pid`.
pub fn thread_signals(pid: i32, tid: i32) -> Result<ThreadSignals> {
    let path = format!("/proc/{pid}/task/{tid}/status");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::for_pid(pid, format!("reading {path}"), e))?;
    let f = |k| status_hex(&text, k).unwrap_or(0);
    Ok(ThreadSignals {
        pending: f("SigPnd") | f("ShdPnd"),
        blocked: f("SigBlk"),
        ignored: f("SigIgn"),
        caught: f("SigCgt"),
    })
}

/// The system call thread `tid` of process `pid` is blocked in
/// (`/proc/PID/task/TID/syscall`): its number and six arguments; `None`
/// when it runs or is blocked outside a system call.
pub fn thread_syscall(pid: i32, tid: i32) -> Result<Option<(i64, [u64; 6])>> {
    let path = format!("/proc/{pid}/task/{tid}/syscall");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::for_pid(pid, format!("reading {path}"), e))?;
    Ok(parse_syscall_line(&text))
}

/// Parses a `/proc/PID/syscall` line: `NR ARG1 … ARG6 SP PC` (hexadecimal
/// arguments), `-1 SP PC` or `running`.
pub fn parse_syscall_line(text: &str) -> Option<(i64, [u64; 6])> {
    let mut it = text.split_whitespace();
    let nr: i64 = it.next()?.parse().ok()?;
    if nr < 0 {
        return None;
    }
    let mut args = [0u64; 6];
    for a in &mut args {
        let v = it.next()?;
        *a = u64::from_str_radix(v.trim_start_matches("0x"), 16).ok()?;
    }
    Some((nr, args))
}

/// What KSM merges of one process now (`/proc/PID/ksm_stat`, Linux 6.1+).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct KsmStat {
    /// Pages of the process merged with others (`ksm_merging_pages`).
    pub merging_pages: u64,
    /// Pages merged into the zero page (`ksm_zero_pages`, Linux 6.10+).
    pub zero_pages: u64,
    /// What KSM saves the process, bytes, less its own cost (`ksm_process_profit`).
    pub process_profit: i64,
}

/// Reads `/proc/PID/ksm_stat`; `None` where the kernel has none.
pub fn ksm_stat(pid: i32) -> Option<KsmStat> {
    let text = read_trimmed(proc_dir(Some(pid)).join("ksm_stat")).ok()?;
    let field = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(char::is_whitespace)?;
            (k == key).then(|| v.trim().parse::<i64>().ok())?
        })
    };
    Some(KsmStat {
        merging_pages: field("ksm_merging_pages").unwrap_or(0).max(0) as u64,
        zero_pages: field("ksm_zero_pages").unwrap_or(0).max(0) as u64,
        process_profit: field("ksm_process_profit").unwrap_or(0),
    })
}

/// Peak resident set size of the calling process (`VmHWM`), KiB.
pub fn peak_rss_kib() -> Result<u64> {
    let text =
        read_trimmed("/proc/self/status").map_err(|e| Error::os("reading /proc/self/status", e))?;
    status_field(&text, "VmHWM").ok_or_else(|| Error::MissingField {
        file: "/proc/self/status".into(),
        field: "VmHWM",
    })
}

/// Resets the peak RSS of the calling process to its current RSS.
pub fn reset_peak_rss() -> Result<()> {
    std::fs::write(
        "/proc/self/clear_refs",
        pagewise_sys::pagemap::CLEAR_REFS_PEAK_RSS,
    )
    .map_err(|e| Error::os("resetting the peak RSS through /proc/self/clear_refs", e))
}

/// Checks that every region lies inside readable and writable mappings of
/// the calling process whose memory is of one of the kinds `works_on`
/// (`capability` names who asks, for the error). Overlaps between regions
/// are the caller's to refuse.
pub fn check_mapped_writable(
    regions: &[Region],
    capability: &str,
    works_on: &[MemoryKind],
) -> Result<()> {
    let maps = maps(None)?;
    for r in regions {
        let mut addr = r.start;
        while addr < r.end() {
            match maps.iter().find(|m| m.start <= addr && addr < m.end) {
                Some(m) if m.read && m.write && !works_on.contains(&m.kind()) => {
                    return Err(Error::MemoryType {
                        start: r.start,
                        len: r.len,
                        at: m.start,
                        kind: m.kind().name(),
                        capability: capability.to_string(),
                        works_on: works_on.iter().map(|k| k.name()).collect(),
                    });
                }
                Some(m) if m.read && m.write => addr = m.end,
                Some(m) => {
                    return Err(Error::NotWritable {
                        start: r.start,
                        len: r.len,
                        at: m.start,
                        mapped: true,
                    })
                }
                None => {
                    return Err(Error::NotWritable {
                        start: r.start,
                        len: r.len,
                        at: addr,
                        mapped: false,
                    })
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A userfaultfd's fdinfo before and after its `UFFDIO_API` (as Linux
    /// 6.18 writes it: the kernel's own bit 31 once set up).
    #[test]
    fn a_userfaultfd_is_set_up_once_its_api_is_made() {
        let before = "pos:\t0\nflags:\t02004000\nmnt_id:\t16\nino:\t1057\npending:\t0\ntotal:\t0\nAPI:\taa:0:80000000000001ff\n";
        let after = before.replace("aa:0:", "aa:80000000:");
        let asked = before.replace("aa:0:", "aa:8000:");
        assert!(!uffd_set_up(before));
        assert!(uffd_set_up(&after));
        assert!(uffd_set_up(&asked), "an older kernel: the features asked");
        assert!(!uffd_set_up("pos:\t0\n"), "no API line");
    }

    /// The census is loadavg's task count and last pid; a thread begun
    /// moves it.
    #[test]
    fn the_task_census_moves_when_a_task_begins() {
        assert_eq!(
            parse_task_census("0.08 0.12 0.10 2/345 6789\n"),
            Some((345, 6789))
        );
        for bad in [
            "",
            "0.1 0.2 0.3",
            "0.1 0.2 0.3 2-345 6789",
            "0.1 0.2 0.3 2/x 6789",
        ] {
            assert_eq!(parse_task_census(bad), None, "{bad:?}");
        }
        let census = TaskCensus::open().unwrap();
        let before = census.read().expect("/proc/loadavg");
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || rx.recv());
        let during = census.read().expect("/proc/loadavg");
        assert_ne!(before, during, "a thread began between the two reads");
        drop(tx);
        let _ = t.join();
        println!("ok   census {before:?} -> {during:?} with a thread begun");
    }

    #[test]
    fn the_four_uids_are_read_as_status_writes_them() {
        let t = "Name:\tx\nUid:\t1000\t0\t1000\t0\nGid:\t5\t5\t5\t5\n";
        assert_eq!(status_ids(t, "Uid"), Some(vec![1000, 0, 1000, 0]));
        assert_eq!(status_ids(t, "Gid:"), Some(vec![5; 4]));
        assert_eq!(status_ids("Uid:\t1\tx\n", "Uid"), None);
        assert_eq!(status_ids(t, "Groups"), None);
    }

    #[test]
    fn parses_maps_lines() {
        let t = "7f0000000000-7f0000021000 rw-p 00000000 00:00 0 \n\
                 55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]\n\
                 7ffd1000-7ffd2000 r-xp 00001000 fd:01 1234                       /usr/lib/libc.so.6\n\
                 ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]\n";
        let m = parse_maps(t);
        assert_eq!(m.len(), 4);
        assert!(m[0].is_anonymous() && m[0].write && m[0].path.is_empty());
        assert!(m[1].is_anonymous() && m[1].path == "[heap]");
        assert!(!m[2].is_anonymous() && m[2].exec && m[2].offset == 0x1000 && m[2].inode == 1234);
        assert!(m[3].is_special());
        assert_eq!(m[0].len(), 0x21000);
    }
    #[test]
    fn reads_stat_fields_after_a_name_with_spaces_and_parentheses() {
        // Fields 10 to 22 hold 100 × their number: 20 the threads, 22 the start time.
        let t: String = (10..=22).fold("42 (a) b) c) S 1 42 42 0 -1 4194560".into(), |t, n| {
            format!("{t} {}", n * 100)
        });
        let got: Vec<_> = [9, 20, 22, 23, 2].map(|n| stat_field(&t, n)).into();
        assert_eq!(got, [Some(4194560), Some(2000), Some(2200), None, None]);
    }
    #[test]
    fn knows_whose_thread_an_id_is() {
        let me = std::process::id() as i32;
        let (tx, rx) = std::sync::mpsc::channel();
        let (done, wait) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = tx.send(pagewise_sys::process::gettid());
            let _ = wait.recv();
        });
        let tid = rx.recv().unwrap();
        assert!(thread_of(me, tid), "a thread of this process");
        assert!(thread_of(me, me), "its main thread");
        assert!(!thread_of(1, tid), "this process's thread is not init's");
        assert!(!thread_of(me, 1), "init is not a thread of this process");
        drop(done);
        let _ = t.join();
        assert!(!thread_of(me, tid), "a thread that ended");
    }
    #[test]
    fn knows_the_living() {
        assert!(is_alive(std::process::id() as i32));
        assert!(!is_alive(i32::MAX));
    }
    #[test]
    fn reads_choices_and_fields() {
        assert_eq!(bracketed_choice("always [madvise] never"), Some("madvise"));
        assert_eq!(
            status_field("VmRSS:\t  1234 kB\nVmSwap: 0 kB", "VmRSS"),
            Some(1234)
        );
        // With its colon too (three callers once read nothing that way).
        assert_eq!(
            status_field("MemTotal: 99 kB\nMemAvailable:  7 kB", "MemAvailable:"),
            Some(7)
        );
    }
}

/// What a process holds resident (`/proc/PID/smaps_rollup`), KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct Resident {
    /// Resident set (`Rss`).
    pub rss_kib: u64,
    /// Of it, anonymous memory mapped by huge pages (`AnonHugePages`).
    pub anon_huge_kib: u64,
}

/// Reads what process `pid` holds resident.
pub fn resident(pid: i32) -> Result<Resident> {
    let path = proc_dir(Some(pid)).join("smaps_rollup");
    let t = std::fs::read_to_string(&path)
        .map_err(|e| Error::for_pid(pid, "reading smaps_rollup", e))?;
    Ok(Resident {
        rss_kib: status_field(&t, "Rss").unwrap_or(0),
        anon_huge_kib: status_field(&t, "AnonHugePages").unwrap_or(0),
    })
}

/// The counters of `/proc/vmstat` named in `keys`, in that order (0 for a
/// counter this kernel does not have).
pub fn vmstat(keys: &[&str]) -> Result<Vec<u64>> {
    let t = std::fs::read_to_string("/proc/vmstat")
        .map_err(|e| Error::os("reading /proc/vmstat", e))?;
    Ok(keys
        .iter()
        .map(|k| {
            t.lines()
                .find_map(|l| {
                    let (name, v) = l.split_once(' ')?;
                    (name == *k).then(|| v.trim().parse().ok())?
                })
                .unwrap_or(0)
        })
        .collect())
}

/// CPU time process (or thread) `pid` has used, user and system, from
/// `/proc/PID/stat` (clock-tick resolution).
pub fn cpu_time(pid: i32) -> Result<std::time::Duration> {
    let t = std::fs::read_to_string(proc_dir(Some(pid)).join("stat"))
        .map_err(|e| Error::for_pid(pid, "reading stat", e))?;
    // After the command name in parentheses: state is field 3, utime 14,
    // stime 15.
    let rest = t
        .rsplit_once(')')
        .map(|x| x.1)
        .ok_or_else(|| Error::MissingField {
            file: format!("/proc/{pid}/stat"),
            field: "command name",
        })?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    let ticks = tick(11) + tick(12);
    let hz = pagewise_sys::process::clock_ticks_per_second();
    Ok(std::time::Duration::from_nanos(
        ticks.saturating_mul(1_000_000_000) / hz,
    ))
}

/// Every process's pid now (`/proc`'s numeric entries), in no order.
pub fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// The node's tasks (threads) and the last pid given out, from
/// `/proc/loadavg` (in the reader's pid namespace), kept open: the same
/// pair twice means no task began or ended between the two reads (an end
/// lowers the count, a beginning moves the last pid), without listing
/// `/proc`.
#[derive(Debug)]
pub struct TaskCensus(std::fs::File);

impl TaskCensus {
    /// Opens `/proc/loadavg`.
    pub fn open() -> std::io::Result<TaskCensus> {
        std::fs::File::open("/proc/loadavg").map(TaskCensus)
    }

    /// The tasks now and the last pid given out.
    pub fn read(&self) -> Option<(u64, u64)> {
        use std::os::unix::fs::FileExt;
        let mut buf = [0u8; 128];
        let n = self.0.read_at(&mut buf, 0).ok()?;
        parse_task_census(std::str::from_utf8(&buf[..n]).ok()?)
    }
}

/// [`TaskCensus::read`] of `/proc/loadavg`'s text: `1.0 0.5 0.2 2/345 6789`.
fn parse_task_census(text: &str) -> Option<(u64, u64)> {
    let mut f = text.split_ascii_whitespace().skip(3);
    let (_, tasks) = f.next()?.split_once('/')?;
    Some((tasks.parse().ok()?, f.next()?.parse().ok()?))
}

/// The pid of the kernel thread named `name` (a child of `kthreadd`, pid
/// 2), if there is one.
pub fn kernel_thread(name: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = read_trimmed(e.path().join("comm")).ok()?;
        let status = std::fs::read_to_string(e.path().join("status")).ok()?;
        (comm == name && status_field(&status, "PPid") == Some(2)).then_some(pid)
    })
}
