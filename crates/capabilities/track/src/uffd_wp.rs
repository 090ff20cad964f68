//! The `uffd-wp` backend: asynchronous userfaultfd write-protect
//! ([`pagewise_mech::wp::UffdWp`]), read and re-armed by `PAGEMAP_SCAN` in
//! one atomic walk.

use super::{Backend, BackendKind, CollectStats};
use crate::{Error, Result};
use pagewise_mech::region::{PageRange, Region};
use pagewise_mech::wp::UffdWp;
use pagewise_mech::Error as MechError;

/// The `uffd-wp` backend over explicit regions.
///
/// Whole-process tracking (lenient) meets mappings that another userfaultfd
/// already holds, such as one the program registered itself: the kernel
/// refuses a second registration (`EBUSY`). Those are tracked by content
/// hashing instead ([`super::hash::HashBackend`]), said once in
/// [`Backend::note`], so that no write to them goes unreported.
pub struct UffdWpBackend {
    wp: UffdWp,
    regions: Vec<Region>,
    /// Fail when a region is no longer registered (explicit regions), rather
    /// than skip it (whole-process tracking, where mappings change).
    strict: bool,
    /// Whose memory, for the fallback.
    target: super::Target,
    /// Regions another userfaultfd holds, hashed instead.
    fallback: Option<super::hash::HashBackend>,
    note: Option<String>,
    /// The target was seen holding a userfaultfd of its own
    /// ([`pagewise_mech::procfs::owns_userfaultfd`]): nothing of it is
    /// registered any more (a mapping it registers later would be refused
    /// to it), and its memory is hashed instead.
    yielded: bool,
}

impl std::fmt::Debug for UffdWpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UffdWpBackend")
            .field("wp", &self.wp)
            .field("regions", &self.regions)
            .field("strict", &self.strict)
            .field("note", &self.note)
            .field("yielded", &self.yielded)
            .finish_non_exhaustive()
    }
}

impl UffdWpBackend {
    pub(crate) fn new() -> Result<Self> {
        Ok(UffdWpBackend {
            wp: UffdWp::open()?,
            regions: Vec::new(),
            strict: true,
            target: super::Target::SelfProcess,
            fallback: None,
            note: None,
            yielded: false,
        })
    }
    pub(crate) fn new_lenient() -> Result<Self> {
        let mut b = Self::new()?;
        b.strict = false;
        Ok(b)
    }
    /// Tracks process `pid` from outside (see [`UffdWp::open_in`]; with
    /// `sparse`, [`UffdWp::open_in_sparse`]).
    pub(crate) fn for_process(pid: i32, sparse: bool) -> Result<Self> {
        Ok(UffdWpBackend {
            wp: match sparse {
                true => UffdWp::open_in_sparse(pid)?,
                false => UffdWp::open_in(pid)?,
            },
            regions: Vec::new(),
            strict: false,
            target: super::Target::Pid(pid),
            fallback: None,
            note: None,
            yielded: false,
        })
    }

    /// Tracks `region` by hashing: another userfaultfd holds it.
    fn add_fallback(&mut self, region: Region, baseline: bool) -> Result<()> {
        if self.fallback.is_none() {
            self.fallback = Some(super::hash::HashBackend::new(self.target)?);
        }
        if self.note.is_none() {
            self.note = Some(format!(
                "{:#x}..{:#x} (and any like it) is registered with another userfaultfd \
                 (the program's own): tracked by hashing its pages instead of uffd-wp",
                region.start,
                region.end()
            ));
        }
        self.fallback
            .as_mut()
            .expect("made above")
            .add_region(region, baseline)
    }

    /// Whether another process tracked here has come to hold a userfaultfd
    /// of its own since the last look (checked once per collection).
    fn must_yield(&self) -> bool {
        match self.target {
            super::Target::Pid(pid) if !self.yielded => {
                pagewise_mech::procfs::owns_userfaultfd(pid)
            }
            _ => false,
        }
    }

    fn in_fallback(&self, region: &Region) -> bool {
        self.fallback
            .as_ref()
            .is_some_and(|f| f.regions().contains(region))
    }
}

impl Drop for UffdWpBackend {
    fn drop(&mut self) {
        // Nothing left registered or protected (closing the descriptor
        // would also do it; saying it costs nothing).
        for r in std::mem::take(&mut self.regions) {
            let _ = self.wp.unregister(r);
        }
    }
}

impl Backend for UffdWpBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::UffdWp
    }

    fn scan(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<()> {
        self.wp.check_memory()?;
        let yielding = self.must_yield();
        if yielding {
            // Fingerprinted first, then collected, then let go: a write
            // before the collection is in it, one after differs from the
            // fingerprint.
            for r in self.regions.clone() {
                self.add_fallback(r, true)?;
            }
        }
        for r in &self.regions {
            self.wp
                .scan_written(r.start, r.end(), self.strict, true, out)?;
        }
        if yielding {
            for r in std::mem::take(&mut self.regions) {
                let _ = self.wp.unregister(r);
            }
            self.yielded = true;
            self.note = Some(
                "the process made a userfaultfd of its own: its memory is let go by uffd-wp (a \
                 mapping it registered would otherwise be refused to it) and tracked by hashing \
                 its pages from now on"
                    .into(),
            );
        }
        if let Some(f) = self.fallback.as_mut() {
            f.scan(out, stats)?;
            pagewise_mech::region::normalize(out);
        }
        Ok(())
    }

    fn peek(&mut self, out: &mut Vec<PageRange>, stats: &mut CollectStats) -> Result<bool> {
        self.wp.check_memory()?;
        let mut mine = Vec::new();
        for r in &self.regions {
            self.wp
                .scan_written(r.start, r.end(), self.strict, false, &mut mine)?;
        }
        if let Some(f) = self.fallback.as_mut() {
            if !f.regions().is_empty() && !f.peek(&mut mine, stats)? {
                return Ok(false);
            }
            pagewise_mech::region::normalize(&mut mine);
        }
        out.extend(mine);
        Ok(true)
    }

    fn add_region(&mut self, region: Region, baseline: bool) -> Result<()> {
        self.wp.check_memory()?;
        if self.yielded {
            return self.add_fallback(region, baseline);
        }
        match self.wp.register(region, baseline) {
            Ok(()) => {}
            Err(MechError::Os { source, .. })
                if !self.strict && source.raw_os_error() == Some(libc::EBUSY) =>
            {
                return self.add_fallback(region, baseline);
            }
            // Explicit regions of this process: say who may hold them.
            Err(MechError::Os { source, .. }) if source.raw_os_error() == Some(libc::EBUSY) => {
                return Err(Error::HeldElsewhere {
                    start: region.start,
                    end: region.end(),
                });
            }
            Err(e) => return Err(e.into()),
        }
        let i = self.regions.partition_point(|r| r.start < region.start);
        self.regions.insert(i, region);
        Ok(())
    }

    fn remove_region(&mut self, region: Region) -> Result<()> {
        if self.in_fallback(&region) {
            return self
                .fallback
                .as_mut()
                .expect("in_fallback")
                .remove_region(region);
        }
        self.wp.unregister(region)?;
        self.regions.retain(|r| *r != region);
        Ok(())
    }

    fn regions(&self) -> Vec<Region> {
        let mut v = self.regions.clone();
        if let Some(f) = &self.fallback {
            v.extend(f.regions());
            v.sort_by_key(|r| r.start);
        }
        v
    }

    fn note(&self) -> Option<&str> {
        self.note.as_deref()
    }
}
