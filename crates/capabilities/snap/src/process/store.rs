//! Snapshots of another process saved to a durable store and loaded back
//! to restore: the pages, and the process record (layout, program break,
//! threads, start time; descriptors from store format 4).

use super::{ProcSnap, ProcessSnapshots, RollbackRefusal};
use crate::disk::{DiskStore, ProcessRecord, SaveStats};
use crate::Result;
use crate::{SnapId, TakeStats};
use std::time::Instant;

impl ProcessSnapshots {
    /// Saves snapshot `id` into `disk` with its process record; pages the
    /// store already has are not written again.
    pub fn save(&self, id: SnapId, disk: &mut DiskStore, label: &str) -> Result<SaveStats> {
        let s = self.snap(id)?;
        let regions: Vec<_> = s.data.iter().map(|(r, _)| *r).collect();
        let mut w = disk.writer(&regions, Some(self.pid), label)?;
        for (_, t) in &s.data {
            crate::table::push_pages(&mut w, &self.store, std::slice::from_ref(t))?;
        }
        if let Some(layout) = &s.layout {
            w.process_record(&ProcessRecord {
                start_time: self.start_time.unwrap_or(0),
                brk: s.brk,
                layout: layout.clone(),
                threads: s.threads.clone(),
                fds: s.fds.clone(),
                identity: self.identity,
            });
        }
        w.finish()
    }

    /// Loads snapshot `disk_id` of `disk` as a snapshot of this handle, to
    /// restore like any other. A snapshot of another process (another pid,
    /// or the same pid started at another time) is refused unless
    /// `another_process`; one without a process record (store format 2)
    /// restores memory alone.
    pub fn load(
        &mut self,
        disk: &DiskStore,
        disk_id: u64,
        another_process: bool,
    ) -> Result<SnapId> {
        let t0 = Instant::now();
        let ds = disk.load(disk_id)?;
        let record = match ds.record.is_empty() {
            true => None,
            false => Some(ProcessRecord::decode(&ds.record).map_err(|why| {
                pagewise_mech::Error::Corrupt {
                    path: disk.dir().display().to_string(),
                    what: format!("snapshot {disk_id}: {why}"),
                }
            })?),
        };
        let then_start = record.as_ref().map(|r| r.start_time);
        let same = ds.pid == Some(self.pid) && (record.is_none() || then_start == self.start_time);
        if !same && !another_process {
            return Err(RollbackRefusal::AnotherProcess {
                pid: self.pid,
                stored: disk_id,
                then: ds.pid,
            }
            .into());
        }
        // The same process, but another program since (an exec): refused
        // the same way. A record without an identity (index version 3)
        // says nothing.
        let then_program = record.as_ref().and_then(|r| r.identity);
        if same && !another_process && then_program.is_some() && then_program != self.identity {
            return Err(RollbackRefusal::ExecSince {
                pid: self.pid,
                stored: disk_id,
            }
            .into());
        }
        let mut stats = TakeStats::default();
        let tables = crate::table::from_disk(&mut self.store, disk, &ds, &mut stats)?;
        // Shared memory is not put back (a restore would change it under
        // every other process that maps it): its regions are left out, as
        // the snapshot's layout says them, or, without one, as the process
        // maps them now (shared, at the same place).
        let shared: Vec<(u64, u64)> = match &record {
            Some(r) => r
                .layout
                .iter()
                .filter(|v| v.shared)
                .map(|v| (v.start, v.end))
                .collect(),
            None => pagewise_mech::procfs::maps(Some(self.pid))?
                .iter()
                .filter(|m| m.shared)
                .map(|m| (m.start, m.end))
                .collect(),
        };
        let (data, left): (Vec<_>, Vec<_>) = ds
            .regions
            .iter()
            .copied()
            .zip(tables)
            .partition(|(r, _)| !shared.contains(&(r.start, r.end())));
        let left = left.into_iter().map(|(_, t)| t).collect();
        crate::table::release(&mut self.store, &mut self.spare, left);
        stats.pages = ds.pages();
        stats.elapsed_ns = t0.elapsed().as_nanos() as u64;
        let (layout, brk, threads, fds) = match record {
            Some(r) => (Some(r.layout), r.brk, r.threads, r.fds),
            None => (None, None, Vec::new(), None),
        };
        let id = self.next_id;
        self.next_id += 1;
        let tids = threads.iter().map(|t| t.tid).collect();
        self.snaps.insert(
            id,
            ProcSnap {
                layout,
                data,
                brk,
                threads,
                tids,
                fds,
                take: stats,
            },
        );
        Ok(id)
    }
}
