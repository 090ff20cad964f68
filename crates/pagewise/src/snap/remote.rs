//! Snapshots of another process into a durable store.
//!
//! The process is stopped (see [`crate::stop`]) while its writable mappings
//! are read through `process_vm_readv`, and resumed before the snapshot is
//! synced to disk. Anonymous memory that was never populated is recorded as
//! zero pages without being read (`PAGEMAP_SCAN`); file-backed mappings are
//! read whole, since their unpopulated pages hold the file's contents. Pages
//! the store already has are not written again, so a series of snapshots
//! costs the pages that changed (plus an index of 8 bytes per page).

use super::disk::{DiskStore, SaveStats};
use crate::stop::Stopped;
use crate::walk::{read_remote, PageWalker};
use crate::{procfs, Error, Region, Result, PAGE_SIZE};
use serde::Serialize;
use std::time::Instant;

/// Bytes read per `process_vm_readv`.
const CHUNK: usize = 1 << 20;

/// What one snapshot of another process did.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessSnapshot {
    /// What the store wrote.
    pub save: SaveStats,
    /// Mappings snapshotted.
    pub regions: usize,
    /// Pages read from the process.
    pub pages_read: u64,
    /// Threads stopped.
    pub threads: usize,
    /// How long the process was stopped, ms.
    pub stopped_ms: f64,
    /// The whole snapshot, ms (including the sync to disk).
    pub total_ms: f64,
}

/// Snapshots the writable memory of process `pid` into `disk`.
pub fn snapshot_process(pid: i32, disk: &mut DiskStore, label: &str) -> Result<ProcessSnapshot> {
    let t0 = Instant::now();
    procfs::check_target(pid)?;
    let served = procfs::uffd_served(Some(pid))?;
    if !served.is_empty() {
        return Err(Error::MemoryType(format!(
            "process {pid} serves its own page faults (a userfaultfd over {} mappings, as under \
             `pagewise farmem run`): stopped, it could not serve the reads of a snapshot, and its \
             remote pages are not at their addresses; snapshot it without far-memory emulation",
            served.len()
        )));
    }
    let stopped = Stopped::new(pid)?;
    let threads = stopped.threads();
    let maps = procfs::writable(Some(pid))?;
    let regions: Vec<(Region, bool)> = maps
        .iter()
        .filter_map(|m| {
            Region::new(m.start, m.len())
                .ok()
                .map(|r| (r, m.inode == 0))
        })
        .collect();
    let only: Vec<Region> = regions.iter().map(|r| r.0).collect();
    let mut walker = PageWalker::new(Some(pid))?;
    let mut w = disk.writer(&only, Some(pid), label)?;
    let mut buf = vec![0u8; CHUNK];
    let mut runs = Vec::new();
    let mut pages_read = 0u64;
    for &(r, anonymous) in &regions {
        if anonymous {
            walker.populated(r, &mut runs)?;
        } else {
            runs.clear();
            runs.push((r.start, r.end()));
        }
        let mut cursor = r.start;
        for &(a, b) in &runs {
            w.push_zeros((a - cursor) / PAGE_SIZE as u64)?;
            let mut addr = a;
            while addr < b {
                let len = ((b - addr) as usize).min(CHUNK);
                read_remote(pid, addr, &mut buf[..len])?;
                for page in buf[..len].chunks_exact(PAGE_SIZE) {
                    w.push(page)?;
                }
                pages_read += (len / PAGE_SIZE) as u64;
                addr += len as u64;
            }
            cursor = b;
        }
        w.push_zeros((r.end() - cursor) / PAGE_SIZE as u64)?;
    }
    drop(stopped);
    let stopped_ms = t0.elapsed().as_secs_f64() * 1e3;
    let save = w.finish()?;
    Ok(ProcessSnapshot {
        save,
        regions: regions.len(),
        pages_read,
        threads,
        stopped_ms,
        total_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}
