//! Access coverage from the far-memory engine, driven from outside: the
//! instance opens a window, every member's engine evicts its local pages,
//! and each member reports the pages faulted back by the window's end as a
//! [`CoverageReport`] (the type [`pagewise_mech::access`] owns; `access` depends on
//! no sampler, the sampler on `access`).

use super::instance::{Access, Instance};
use crate::{Error, Result};
use pagewise_mech::access::CoverageReport;
use std::time::{Duration, Instant};

/// The far-memory instance `pid` is a live member of, if any (opened for
/// control: only its owner or root may sample it).
pub fn of(pid: i32) -> Option<Instance> {
    Instance::list()
        .ok()?
        .into_iter()
        .find(|i| i.members().iter().any(|m| m.live && m.pid == pid))
        .and_then(|i| Instance::open(i.name(), Access::Control).ok())
}

/// Coverage of every live member of `inst` over `window` (see
/// [`pagewise_mech::access`]), waiting at most `timeout` for their reports.
pub fn sample(inst: &Instance, window: Duration, timeout: Duration) -> Result<Vec<CoverageReport>> {
    let live = |i: &Instance| -> Vec<i32> {
        i.members()
            .iter()
            .filter(|m| m.live)
            .map(|m| m.pid)
            .collect()
    };
    for p in live(inst) {
        let _ = std::fs::remove_file(inst.coverage_path(p));
    }
    inst.request_coverage(true)?;
    std::thread::sleep(window);
    let req = inst.request_coverage(false)?;
    let until = Instant::now() + timeout;
    let mut out: Vec<CoverageReport> = Vec::new();
    loop {
        let pids = live(inst);
        for &p in &pids {
            if out.iter().any(|r| r.pid == p) {
                continue;
            }
            let path = inst.coverage_path(p);
            let Ok(body) = std::fs::read(&path) else {
                continue;
            };
            let r: CoverageReport =
                serde_json::from_slice(&body).map_err(|e| pagewise_mech::Error::Corrupt {
                    path: path.display().to_string(),
                    what: format!("not a coverage report: {e}"),
                })?;
            if r.request == req {
                let _ = std::fs::remove_file(&path);
                out.push(r);
            }
        }
        if pids.iter().all(|p| out.iter().any(|r| r.pid == *p)) {
            return Ok(out);
        }
        if Instant::now() > until {
            let missing: Vec<i32> = pids
                .iter()
                .filter(|p| !out.iter().any(|r| r.pid == **p))
                .copied()
                .collect();
            return Err(Error::NoCoverageReport {
                pids: missing,
                waited: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
