//! The memory each thread keeps through a memory-only restore, and
//! whether keeping it is consistent.
//!
//! A memory-only restore leaves the threads their registers, so it leaves
//! them the memory they run on too ([`Threads::areas`]): the mapping each stack
//! pointer is in and the one each thread-control block (fs base) is in,
//! which holds the thread's thread-local data. That is consistent only
//! where what the threads keep does not point at memory the restore
//! changes. It does not for a per-thread allocator cache kept in
//! thread-local data (jemalloc's, in Redis): after the snapshot the
//! program freed memory the cache now lists; the restore makes that
//! memory live again, and the allocator hands it out a second time (Redis
//! then dies). [`check`] compares each thread's live memory (its stack
//! from the stack pointer up, its thread-local mapping whole) with the
//! snapshot's, word by word: a word that changed since the snapshot and
//! now points into a page the restore would change refuses the restore
//! ([`RollbackRefusal::ThreadMemoryDiverged`]). A thread that holds no
//! such pointer (it waits where it waited at the snapshot, its caches
//! unchanged) keeps its memory as before.

use super::{ProcessSnapshots, RollbackRefusal, SnapId};
use crate::{Error, Result};
use pagewise_mech::stop::Stopped;
use pagewise_mech::{procfs, remote, Region, PAGE_SIZE};
use std::collections::HashMap;

/// What the threads of a stopped process run on, read once: its maps and
/// each thread's registers.
pub(super) struct Threads {
    pid: i32,
    maps: Vec<procfs::Mapping>,
    regs: Vec<(i32, pagewise_sys::process::Regs)>,
}

/// Reads the maps of `stopped` and the registers of each of its threads.
pub(super) fn read(stopped: &Stopped) -> Result<Threads> {
    let pid = stopped.pid();
    let regs = stopped
        .tids()
        .iter()
        .map(|&tid| {
            pagewise_sys::process::ptrace_getregs(tid)
                .map(|r| (tid, r))
                .map_err(|e| Error::for_pid(pid, format!("PTRACE_GETREGS of {tid}"), e))
        })
        .collect::<Result<_>>()?;
    Ok(Threads {
        pid,
        maps: procfs::maps(Some(pid))?,
        regs,
    })
}

impl Threads {
    /// The mappings the threads run on: each stack pointer's and each fs
    /// base's, sorted, each once.
    pub(super) fn areas(&self) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        for (_, r) in &self.regs {
            for at in [r.rsp, r.fs_base] {
                if let Some(m) = self.maps.iter().find(|m| m.start <= at && at < m.end) {
                    out.push((m.start, m.end));
                }
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Refuses a memory-only restore of snapshot `id` that would put back
/// `restored` under threads whose own memory now points into it (see the
/// module).
pub(super) fn check(
    h: &ProcessSnapshots,
    id: SnapId,
    threads: &Threads,
    restored: &[Region],
) -> Result<()> {
    let (pid, maps) = (threads.pid, &threads.maps);
    let snap = h.snap(id)?;
    let mut changes: HashMap<u64, bool> = HashMap::new();
    let mut page_changes = |page: u64| -> Result<bool> {
        if let Some(&c) = changes.get(&page) {
            return Ok(c);
        }
        let (mut now, mut then) = (vec![0u8; PAGE_SIZE], vec![0u8; PAGE_SIZE]);
        h.read(id, page, &mut then)?;
        let c = remote::read_exact(pid, page, &mut now).is_err() || now != then;
        changes.insert(page, c);
        Ok(c)
    };
    for &(tid, ref r) in &threads.regs {
        let mut live = Vec::new();
        let stack = maps.iter().find(|m| m.start <= r.rsp && r.rsp < m.end);
        if let Some(m) = stack {
            live.push((r.rsp & !7, m.end));
        }
        match maps
            .iter()
            .find(|m| m.start <= r.fs_base && r.fs_base < m.end)
        {
            Some(m) if stack.is_none_or(|s| s.start != m.start) => live.push((m.start, m.end)),
            _ => {}
        }
        for (a, b) in live {
            // The part the snapshot holds (a stack may have grown since).
            let Some((sr, _)) = snap.data.iter().find(|(q, _)| q.start < b && a < q.end()) else {
                continue;
            };
            let (a, b) = (a.max(sr.start), b.min(sr.end()));
            for at in (a..b).step_by(1 << 20) {
                let n = ((b - at) as usize).min(1 << 20);
                let (mut now, mut then) = (vec![0u8; n], vec![0u8; n]);
                if remote::read_exact(pid, at, &mut now).is_err() {
                    continue;
                }
                h.read(id, at, &mut then)?;
                for (k, (w, v)) in now.chunks_exact(8).zip(then.chunks_exact(8)).enumerate() {
                    if w == v {
                        continue;
                    }
                    let to = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
                    if restored.iter().any(|q| q.contains(to)) && page_changes(to & !4095)? {
                        return Err(RollbackRefusal::ThreadMemoryDiverged {
                            pid,
                            id,
                            tid,
                            word: at + 8 * k as u64,
                            points_to: to,
                        }
                        .into());
                    }
                }
            }
        }
    }
    Ok(())
}
