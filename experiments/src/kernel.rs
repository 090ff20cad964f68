//! The kernel's own huge-page policies, the baselines every huge-page
//! experiment runs beside the agent, in the same run: what a user compares
//! pagewise with is what their kernel already does.
//!
//! - `never`: no huge page at all;
//! - `madvise`: huge pages only where the program asks (the experiments'
//!   programs do not), the setting this machine ships with;
//! - `always`: a huge page at every fault of an aligned 2 MiB range, and
//!   khugepaged collapsing the others;
//! - `always + shrinker`: the same, with the THP shrinker
//!   (`shrink_underused` 1, Linux 6.12) splitting, under memory pressure,
//!   a huge page with more than `max_ptes_none` zero subpages, and
//!   khugepaged's `max_ptes_none` at 409 (at 511, the default, the shrinker
//!   never splits, and this is plain `always`);
//! - `64K mTHP`: 64 KiB anonymous huge pages at every fault
//!   (`hugepages-64kB/enabled` `always`, Linux 6.8), and no 2 MiB ones.
//!
//! Every setting a policy writes is journaled and put back when its
//! [`Applied`] is dropped (or, after a crash, by the next pagewise to
//! run), as the agents' settings are. The other knobs (`defrag`,
//! khugepaged's pace) are left as the machine has them, the same for every
//! policy, and recorded with [`thp_knobs`].

use pagewise::Result;
use pagewise_agent::settings::SettingGuard;
use serde::Serialize;
use std::path::Path;

/// Where the THP settings live.
pub const THP_DIR: &str = "/sys/kernel/mm/transparent_hugepage";

/// khugepaged's `max_ptes_none` with the shrinker: what Meta's shrinker
/// series ran with (80 % of the subpages may be zero before a huge page
/// counts as underused).
pub const SHRINKER_MAX_PTES_NONE: u32 = 409;

/// One of the kernel's huge-page policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ThpPolicy {
    /// No huge pages.
    Never,
    /// Huge pages where the program asks (`MADV_HUGEPAGE`) only.
    Madvise,
    /// Huge pages everywhere, the shrinker off.
    Always,
    /// Huge pages everywhere, the shrinker on, `max_ptes_none` 409.
    AlwaysShrinker,
    /// 64 KiB anonymous huge pages everywhere, no 2 MiB ones.
    Mthp64k,
}

impl ThpPolicy {
    /// Every policy, in the order the reports list them.
    pub const ALL: [ThpPolicy; 5] = [
        ThpPolicy::Never,
        ThpPolicy::Madvise,
        ThpPolicy::Always,
        ThpPolicy::AlwaysShrinker,
        ThpPolicy::Mthp64k,
    ];

    /// The name the reports use.
    pub fn name(self) -> &'static str {
        match self {
            ThpPolicy::Never => "kernel: never",
            ThpPolicy::Madvise => "kernel: madvise",
            ThpPolicy::Always => "kernel: always",
            ThpPolicy::AlwaysShrinker => "kernel: always + shrinker",
            ThpPolicy::Mthp64k => "kernel: 64K mTHP",
        }
    }

    /// The settings it writes under [`THP_DIR`], in order: (file, value).
    /// Each policy sets every file any of them sets, so that one applied
    /// after another leaves nothing of the first.
    pub fn settings(self) -> Vec<(&'static str, String)> {
        let (enabled, shrink, mthp) = match self {
            ThpPolicy::Never => ("never", "0", "never"),
            ThpPolicy::Madvise => ("madvise", "0", "never"),
            ThpPolicy::Always => ("always", "0", "never"),
            ThpPolicy::AlwaysShrinker => ("always", "1", "never"),
            ThpPolicy::Mthp64k => ("never", "0", "always"),
        };
        let mut v = vec![
            ("enabled", enabled.to_string()),
            ("hugepages-64kB/enabled", mthp.to_string()),
            ("shrink_underused", shrink.to_string()),
        ];
        if self == ThpPolicy::AlwaysShrinker {
            v.push((
                "khugepaged/max_ptes_none",
                SHRINKER_MAX_PTES_NONE.to_string(),
            ));
        }
        v
    }

    /// Why this kernel cannot run the policy (a setting it does not have),
    /// or `None`.
    pub fn missing(self) -> Option<String> {
        self.settings()
            .into_iter()
            .map(|(f, _)| format!("{THP_DIR}/{f}"))
            .find(|p| !Path::new(p).exists())
            .map(|p| format!("this kernel has no {p}"))
    }

    /// The policies of `ALL` this kernel can run, and for each other one
    /// why not (`never: this kernel has no ...`).
    pub fn available() -> (Vec<ThpPolicy>, Vec<String>) {
        let (mut ready, mut skipped) = (Vec::new(), Vec::new());
        for p in Self::ALL {
            match p.missing() {
                Some(why) => skipped.push(format!("{}: {why}", p.name())),
                None => ready.push(p),
            }
        }
        (ready, skipped)
    }

    /// Applies the policy; dropping the answer puts every setting back.
    pub fn apply(self) -> Result<Applied> {
        let mut guards = Vec::new();
        for (f, value) in self.settings() {
            guards.push(SettingGuard::set(format!("{THP_DIR}/{f}"), &value)?);
        }
        Ok(Applied {
            policy: self,
            _guards: guards,
        })
    }
}

/// `run` under each of `policies` in turn, each applied just before and
/// put back just after it (repeat `repeat`, said to `progress`).
pub fn under_each<T>(
    policies: &[ThpPolicy],
    repeat: usize,
    progress: &mut dyn FnMut(&str),
    mut run: impl FnMut(ThpPolicy) -> Result<T>,
) -> Result<Vec<T>> {
    let mut out = Vec::new();
    for &policy in policies {
        progress(&format!("{}, run {}", policy.name(), repeat + 1));
        let applied = policy.apply()?;
        out.push(run(policy)?);
        drop(applied);
    }
    Ok(out)
}

/// A policy in force; its settings are put back when it is dropped.
#[derive(Debug)]
pub struct Applied {
    /// The policy.
    pub policy: ThpPolicy,
    _guards: Vec<SettingGuard>,
}

/// The THP knobs no policy changes, as the machine has them (`file=value`):
/// what every scheme of a run shared.
pub fn thp_knobs() -> Vec<String> {
    [
        "defrag",
        "khugepaged/defrag",
        "khugepaged/max_ptes_none",
        "khugepaged/pages_to_scan",
        "khugepaged/scan_sleep_millisecs",
        "use_zero_page",
    ]
    .iter()
    .filter_map(|f| Some(format!("{f}={}", in_force(f)?)))
    .collect()
}

/// The 64 KiB huge pages faulted in so far on this machine (0 where the
/// kernel has no count).
pub fn mthp_64k_faults() -> u64 {
    std::fs::read_to_string(format!("{THP_DIR}/hugepages-64kB/stats/anon_fault_alloc"))
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The value in force of a THP setting written as a choice list
/// (`always [madvise] never`: the bracketed one), or as is.
pub fn in_force(file: &str) -> Option<String> {
    pagewise_agent::settings::current(format!("{THP_DIR}/{file}")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each policy sets what it says, and every setting is back as it was
    /// once the policy is dropped.
    #[test]
    fn each_policy_sets_its_settings_and_puts_them_back() {
        let files = [
            "enabled",
            "hugepages-64kB/enabled",
            "shrink_underused",
            "khugepaged/max_ptes_none",
        ];
        let before: Vec<Option<String>> = files.iter().map(|f| in_force(f)).collect();
        for p in ThpPolicy::ALL {
            if let Some(why) = p.missing() {
                pagewise_testkit::skip!("{}: {why}", p.name());
                continue;
            }
            let applied = match p.apply() {
                Ok(a) => a,
                Err(e) if e.to_string().contains("Permission denied") => {
                    pagewise_testkit::skip!("{}: not root ({e})", p.name());
                    return;
                }
                Err(e) => panic!("{}: {e}", p.name()),
            };
            for (f, want) in p.settings() {
                assert_eq!(
                    in_force(f).as_deref(),
                    Some(want.as_str()),
                    "{}: {f}",
                    p.name()
                );
            }
            drop(applied);
            let now: Vec<Option<String>> = files.iter().map(|f| in_force(f)).collect();
            assert_eq!(now, before, "{}: put back", p.name());
        }
    }

    #[test]
    fn every_policy_sets_the_same_files_but_the_shrinkers_threshold() {
        let files =
            |p: ThpPolicy| -> Vec<&str> { p.settings().into_iter().map(|(f, _)| f).collect() };
        for p in ThpPolicy::ALL {
            let mut f = files(p);
            f.retain(|f| *f != "khugepaged/max_ptes_none");
            assert_eq!(f, files(ThpPolicy::Never), "{}", p.name());
        }
    }
}
