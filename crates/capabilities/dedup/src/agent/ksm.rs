//! ksmd as the agent drives it: started, paced so that one pass over the
//! pages made mergeable takes [`Options::full_scan`] (or paced by the
//! kernel's advisor, [`Options::advisor`]), smart scan set as
//! [`Options::smart_scan`] asks; every setting journaled and put back when
//! the agent is dropped (a second agent is refused).

use super::{Action, Agent, KsmReport, Options, KSM_DIR, PAGES};
use pagewise_mech::procfs;
use pagewise_mech::settings::SettingGuard;
use pagewise_mech::Result;
use std::time::Duration;

/// ksmd started and paced by the agent; its settings put back on drop.
pub(super) struct Ksm {
    /// The advisor's mode and target, put back first (the kernel sets
    /// `pages_to_scan` anew when the mode changes; its own guard below
    /// then puts back the value before).
    advisor: Vec<SettingGuard>,
    run: Option<SettingGuard>,
    pages_to_scan: Option<SettingGuard>,
    smart_scan: Option<SettingGuard>,
    ksmd: Option<i32>,
    ksmd_cpu: Option<Duration>,
}

/// A number KSM reports (`/sys/kernel/mm/ksm/NAME`; 0 when unreadable).
pub(super) fn ksm_value(name: &str) -> u64 {
    procfs::read_trimmed(format!("{KSM_DIR}/{name}"))
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

impl Ksm {
    /// Takes ksmd's settings as `opts` asks: with [`Options::full_scan`]
    /// or [`Options::advisor`], ksmd is started, its pace held for the
    /// agent's whole run (the advisor set to pace it, for the latter) and
    /// smart scan set as [`Options::smart_scan`] asks, whatever the policy.
    pub(super) fn claim(opts: &Options) -> Result<Ksm> {
        let mut ksm = Ksm {
            advisor: Vec::new(),
            run: None,
            pages_to_scan: None,
            smart_scan: None,
            ksmd: procfs::kernel_thread("ksmd"),
            ksmd_cpu: None,
        };
        // The agent drives ksmd: it holds its settings for its whole run
        // (journaled, put back at the end; a second agent is refused).
        let drives = opts.full_scan.is_some() || opts.advisor.is_some();
        if drives {
            let run = SettingGuard::claim(format!("{KSM_DIR}/run"))?;
            if ksm_value("run") != 1 {
                run.write("1")?;
            }
            ksm.run = Some(run);
            ksm.pages_to_scan = Some(SettingGuard::claim(format!("{KSM_DIR}/pages_to_scan"))?);
        }
        if let Some(target) = opts.advisor {
            let mode = format!("{KSM_DIR}/advisor_mode");
            let p = pagewise_mech::probe::get();
            if !p.ksm_advisor {
                return Err(pagewise_mech::Error::Unsupported {
                    feature: "the KSM advisor",
                    why: p.why("ksm.advisor"),
                });
            }
            ksm.advisor.push(SettingGuard::set(&mode, "scan-time")?);
            ksm.advisor.push(SettingGuard::set(
                format!("{KSM_DIR}/advisor_target_scan_time"),
                &target.as_secs().max(1).to_string(),
            )?);
        }
        // A kernel without smart scan (before 6.7) has no such file: there
        // is nothing to set.
        let smart = format!("{KSM_DIR}/smart_scan");
        if let (Some(on), true) = (opts.smart_scan, drives) {
            let want = if on { "1" } else { "0" };
            if std::path::Path::new(&smart).exists() {
                let g = SettingGuard::claim(&smart)?;
                if procfs::read_trimmed(&smart).ok().as_deref() != Some(want) {
                    g.write(want)?;
                }
                ksm.smart_scan = Some(g);
            }
        }
        ksm.ksmd_cpu = ksm.ksmd.and_then(|k| procfs::cpu_time(k).ok());
        Ok(ksm)
    }
}

impl Agent {
    /// Sets ksmd's pace from the pages made mergeable (unless the
    /// kernel's advisor paces it); reads KSM's state.
    pub(super) fn pace(&mut self, actions: &mut Vec<Action>) -> KsmReport {
        if let (Some(full), None) = (self.opts.full_scan, self.opts.advisor) {
            let pages: u64 = self
                .targets
                .live()
                .flat_map(|t| t.state.regions.values())
                .filter(|s| s.mergeable)
                .count() as u64
                * PAGES as u64;
            let sleep_ms = ksm_value("sleep_millisecs").max(1);
            let want = (pages * sleep_ms / full.as_millis().max(1) as u64).clamp(100, 20_000);
            let now = ksm_value("pages_to_scan");
            if now != want {
                let path = format!("{KSM_DIR}/pages_to_scan");
                let r = match &self.ksm.pages_to_scan {
                    Some(g) => g.write(&want.to_string()),
                    None => SettingGuard::set(&path, &want.to_string())
                        .map(|g| self.ksm.pages_to_scan = Some(g)),
                };
                match r {
                    Ok(()) => actions.push(Action::Tuned {
                        knob: path,
                        to: want.to_string(),
                    }),
                    Err(e) => actions.push(Action::Failed {
                        pid: 0,
                        what: format!("setting {path}"),
                        why: e.to_string(),
                    }),
                }
            }
        }
        let ksmd_cpu_ms = self.ksm.ksmd.and_then(|k| {
            let now = procfs::cpu_time(k).ok()?;
            let before = self.ksm.ksmd_cpu.replace(now)?;
            Some(now.saturating_sub(before).as_secs_f64() * 1e3)
        });
        self.counters.ksmd_cpu_ms += ksmd_cpu_ms.unwrap_or(0.0);
        KsmReport {
            pages_shared: ksm_value("pages_shared"),
            pages_sharing: ksm_value("pages_sharing"),
            pages_to_scan: ksm_value("pages_to_scan"),
            merging_pages: self
                .targets
                .live()
                .map(|t| {
                    (
                        t.pid,
                        procfs::ksm_stat(t.pid).map_or(0, |k| k.merging_pages),
                    )
                })
                .collect(),
            ksmd_cpu_ms,
        }
    }
}
