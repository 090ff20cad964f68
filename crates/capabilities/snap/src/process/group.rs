//! Putting a whole group back (a container's processes, snapshotted at one
//! instant with [`crate::remote::snapshot_group`]): every process is held
//! stopped at one instant, each is put back from its own snapshot
//! (memory, layout, threads, descriptors, as
//! [`ProcessSnapshots::restore`] does), and the memory they share
//! (`MAP_SHARED` writable mappings, which a restore of one process leaves
//! alone since others use it) is written back too: every process that
//! uses it is being put back to the same instant. None runs until all are
//! back.

use super::{ProcessSnapshots, RestoreOptions, RestoreReport};
use crate::disk::{DiskSnapshot, DiskStore};
use crate::Result;
use pagewise_mech::stop::{StoppedGroup, STOP_WAIT};
use pagewise_mech::{procfs, remote, PAGE_SIZE};
use serde::Serialize;

/// What a group restore did for one process.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[non_exhaustive]
pub struct MemberRestore {
    /// Its pid on the host.
    pub pid: i32,
    /// The snapshot of the store put back into it.
    pub id: u64,
    /// What its restore did.
    pub report: RestoreReport,
    /// Pages of memory it shares with others written back.
    pub shared_pages: u64,
}

/// Puts snapshot `id` of store `disk` back into process `pid`, for every
/// `(pid, id)` of `members`, all held stopped at one instant (see the
/// module).
pub fn restore_group(
    disk: &DiskStore,
    members: &[(i32, u64)],
    opts: RestoreOptions,
) -> Result<Vec<MemberRestore>> {
    let mut handles = Vec::new();
    for &(pid, id) in members {
        let mut h = ProcessSnapshots::open_for_one_restore(pid)?;
        let sid = h.load(disk, id, false)?;
        handles.push((h, sid, disk.load(id)?));
    }
    let pids: Vec<i32> = members.iter().map(|m| m.0).collect();
    let group = StoppedGroup::new(&|| Ok(pids.clone()), STOP_WAIT)?;
    let mut out = Vec::new();
    for (h, sid, ds) in &mut handles {
        let pid = h.pid;
        let Some(held) = group.members().iter().find(|s| s.pid() == pid) else {
            return Err(pagewise_mech::Error::ProcessExited(pid).into());
        };
        let report = h.restore_held(*sid, opts, held, &pids)?;
        let shared_pages = write_shared(disk, ds, pid)?;
        out.push(MemberRestore {
            pid,
            id: ds.id,
            report,
            shared_pages,
        });
    }
    drop(group);
    Ok(out)
}

/// Writes back, into stopped process `pid`, the pages of `snap` that are
/// in the writable shared mappings it has now at the same place and size.
fn write_shared(disk: &DiskStore, snap: &DiskSnapshot, pid: i32) -> Result<u64> {
    let shared: Vec<(u64, u64)> = procfs::maps(Some(pid))?
        .iter()
        .filter(|m| m.shared && m.write && !m.is_special())
        .map(|m| (m.start, m.end))
        .collect();
    let mut page = vec![0u8; PAGE_SIZE];
    let mut written = 0u64;
    let mut first = 0usize;
    for r in &snap.regions {
        let n = r.pages() as usize;
        let entries = snap
            .entries
            .get(first..first.saturating_add(n))
            .unwrap_or(&[]);
        if shared.contains(&(r.start, r.end())) {
            for (i, &entry) in entries.iter().enumerate() {
                disk.read_page(entry, &mut page)?;
                remote::write_exact(pid, r.start + (i * PAGE_SIZE) as u64, &page)?;
                written += 1;
            }
        }
        first += n;
    }
    Ok(written)
}
