//! The `soft-dirty` backend: `clear_refs` and pagemap bit 55.
//!
//! The kernel offers no atomic read-and-clear of soft-dirty bits, and
//! `clear_refs` clears them for the whole process. To lose no write, a remote
//! target is stopped (every thread, with `ptrace`: see [`pagewise_mech::stop`])
//! between reading the bits and clearing them and resumed afterwards, as CRIU
//! does with its freezer. Inside the calling
//! process, other threads that write tracked memory must be paused around a
//! collection. Kernels without `CONFIG_MEM_SOFT_DIRTY` refuse this backend with
//! the probe's reason.

use super::{Backend, BackendKind, CollectStats, Target};
use crate::{Error, Result};
use pagewise_mech::procfs;
use pagewise_mech::region::{push_coalesced, PageRange, Region};
use pagewise_mech::PAGE_SIZE;
use pagewise_sys::pagemap;
use std::fs::File;
use std::os::fd::AsFd;

pub(crate) struct SoftDirtyBackend {
    target: Target,
    pagemap: File,
    regions: Vec<Region>,
    /// Regions added without a baseline: every page is reported at the next scan.
    unseen: Vec<Region>,
    buf: Vec<u64>,
}

impl SoftDirtyBackend {
    pub(crate) fn new(target: Target) -> Result<Self> {
        let pid = target.pid();
        let path = procfs::proc_dir(pid).join("pagemap");
        let pagemap = File::open(&path)
            .map_err(|e| Error::at(pid, format!("opening {}", path.display()), e))?;
        let me = SoftDirtyBackend {
            target,
            pagemap,
            regions: Vec::new(),
            unseen: Vec::new(),
            buf: vec![0; 512],
        };
        me.clear()?;
        Ok(me)
    }

    fn clear(&self) -> Result<()> {
        let pid = self.target.pid();
        let path = procfs::proc_dir(pid).join("clear_refs");
        std::fs::write(&path, pagemap::CLEAR_REFS_SOFT_DIRTY)
            .map_err(|e| Error::at(pid, format!("writing {}", path.display()), e))
    }

    fn read_and_clear(&mut self, out: &mut Vec<PageRange>) -> Result<()> {
        for r in &self.regions {
            let whole_region = self.unseen.contains(r);
            let mut addr = r.start;
            while addr < r.end() {
                let n = (((r.end() - addr) / PAGE_SIZE as u64) as usize).min(self.buf.len());
                pagemap::read_entries(self.pagemap.as_fd(), addr, &mut self.buf[..n])
                    .map_err(|e| Error::os(format!("reading pagemap at {addr:#x}"), e))?;
                for (i, e) in self.buf[..n].iter().enumerate() {
                    if whole_region || e & pagemap::entry::SOFT_DIRTY != 0 {
                        let a = addr + (i * PAGE_SIZE) as u64;
                        push_coalesced(out, a, a + PAGE_SIZE as u64);
                    }
                }
                addr += (n * PAGE_SIZE) as u64;
            }
        }
        self.unseen.clear();
        self.clear()
    }
}

impl Backend for SoftDirtyBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::SoftDirty
    }

    fn scan(&mut self, out: &mut Vec<PageRange>, _stats: &mut CollectStats) -> Result<()> {
        match self.target {
            Target::SelfProcess => self.read_and_clear(out),
            Target::Pid(pid) => {
                // Every thread stopped (and seen stopped) from the read of the
                // bits until they are cleared, so that no write falls between;
                // a process its user had stopped stays stopped after.
                let _stopped = pagewise_mech::stop::Stopped::new(pid)?;
                self.read_and_clear(out)
            }
        }
    }

    fn add_region(&mut self, region: Region, baseline: bool) -> Result<()> {
        if !baseline {
            self.unseen.push(region);
        }
        let i = self.regions.partition_point(|r| r.start < region.start);
        self.regions.insert(i, region);
        Ok(())
    }

    fn remove_region(&mut self, region: Region) -> Result<()> {
        self.regions.retain(|r| *r != region);
        self.unseen.retain(|r| *r != region);
        Ok(())
    }

    fn regions(&self) -> Vec<Region> {
        self.regions.clone()
    }
}
