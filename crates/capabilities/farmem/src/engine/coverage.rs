//! The engine as an access sampler: a coverage window evicts every local
//! page, and the pages faulted back by its end are those touched.

use super::*;

impl Engine {
    /// Opens or closes a coverage window as the instance asks (see the
    /// module docs).
    pub(crate) fn apply_coverage(&mut self, sh: &Shared) -> Result<()> {
        let Some(req) = self.coverage_todo else {
            return Ok(());
        };
        if !(self.moves.is_empty() && self.adopts.is_empty() && self.later.is_empty()) {
            // Not while the address space is changing: after the events.
            return Ok(());
        }
        if req % 2 == 1 {
            // Open: every local page leaves, so its next access is seen.
            for g in 0..self.pages.len() {
                if self.pages[g] != Where::Local || self.class[g] != Placement::Normal {
                    continue;
                }
                self.policy.removed(g);
                match self.evict(sh, g, true) {
                    Ok(_) => {}
                    Err(e) if retry_after_events(&e) => {
                        // Try the whole sweep again after the events.
                        self.policy.inserted(g);
                        return Ok(());
                    }
                    Err(e) => return Err(e),
                }
            }
            self.window = Some(Instant::now());
        } else if let Some(t0) = self.window.take() {
            let report = self.coverage_report(req, t0);
            // Everything local again, as the program had it, before the
            // report says the window is closed.
            self.bring_back(sh)?;
            if let Some((inst, _)) = &self.inst {
                let path = inst.coverage_path(report.pid);
                let body = serde_json::to_vec(&report).map_err(|_| Error::Internal {
                    what: "the coverage report could not be written as JSON",
                    addr: 0,
                })?;
                pagewise_mech::files::replace(&path, &body)?;
            }
        }
        self.coverage = req;
        self.coverage_todo = None;
        Ok(())
    }

    /// Per 2 MiB region, the pages touched since the window opened.
    pub(crate) fn coverage_report(
        &self,
        request: u64,
        t0: Instant,
    ) -> pagewise_mech::access::CoverageReport {
        let mut regions: Vec<[u64; 4]> = Vec::new();
        for &ri in &self.order {
            let r = self.regions[ri];
            for i in 0..r.pages() as usize {
                let w = self.pages[self.first[ri] + i];
                pagewise_mech::access::tally(
                    &mut regions,
                    r.start + (i * PAGE_SIZE) as u64,
                    w != Where::RemoteZero,
                    w == Where::Local,
                );
            }
        }
        pagewise_mech::access::CoverageReport::new(
            std::process::id() as i32,
            request,
            t0.elapsed().as_nanos() as u64,
            regions,
        )
    }
}
