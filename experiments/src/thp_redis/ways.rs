//! The ways `bench thp-redis` compares: the kernel's own policies
//! ([`ThpPolicy`]: THP never, madvise, always, always with the shrinker,
//! 64 KiB mTHP) with no agent, an Ingens-like agent under THP `madvise`,
//! and pagewise's agent under THP `always`. Every way runs in the same
//! memory limit (the shrinker splits only under pressure).

use crate::kernel::ThpPolicy;
use anyhow::{Context, Result};
use pagewise_agent::settings::SettingGuard;
use pagewise_thp::agent::{Budget, Options, Policy, Pressure, Recovery};
use std::time::Duration;

/// One way of running Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Way {
    /// The kernel alone, under one of its policies.
    Kernel(ThpPolicy),
    /// THP `madvise` (Redis does not advise) and the agent promoting
    /// regions at least 90 % resident, no recovery.
    Ingens,
    /// THP `always` and pagewise's agent recovering bloat under pressure.
    Pagewise,
}

/// The settings a way holds while it runs (a kernel policy's, or THP's
/// mode for an agent's way); put back when dropped.
pub struct Held {
    _policy: Option<crate::kernel::Applied>,
    _mode: Option<SettingGuard>,
}

impl Way {
    /// Every way, in the order they run and are reported.
    pub fn all() -> Vec<Way> {
        let mut v: Vec<Way> = ThpPolicy::ALL.into_iter().map(Way::Kernel).collect();
        v.extend([Way::Ingens, Way::Pagewise]);
        v
    }

    /// Its name in the report and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Way::Kernel(ThpPolicy::Never) => "never",
            Way::Kernel(ThpPolicy::Madvise) => "madvise",
            Way::Kernel(ThpPolicy::Always) => "always",
            Way::Kernel(ThpPolicy::AlwaysShrinker) => "always-shrinker",
            Way::Kernel(ThpPolicy::Mthp64k) => "mthp-64k",
            Way::Ingens => "ingens",
            Way::Pagewise => "pagewise",
        }
    }

    /// Why this kernel cannot run it, or `None`.
    pub fn missing(self) -> Option<String> {
        match self {
            Way::Kernel(p) => p.missing(),
            _ => None,
        }
    }

    /// Sets THP as the way runs it.
    pub fn set_up(self) -> Result<Held> {
        Ok(match self {
            Way::Kernel(p) => Held {
                _policy: Some(
                    p.apply()
                        .with_context(|| format!("applying {}", p.name()))?,
                ),
                _mode: None,
            },
            Way::Ingens | Way::Pagewise => {
                let mode = if self == Way::Ingens {
                    "madvise"
                } else {
                    "always"
                };
                Held {
                    _policy: None,
                    _mode: Some(
                        SettingGuard::set(super::THP, mode)
                            .with_context(|| format!("setting {}", super::THP))?,
                    ),
                }
            }
        })
    }

    /// The options of the agent the way runs, or `None` (the kernel's).
    pub(super) fn agent_options(self, cfg: &super::Config, walk_ns: f64) -> Option<Options> {
        if let Way::Kernel(_) = self {
            return None;
        }
        let policy = if self == Way::Ingens {
            Policy::Utilisation(0.9)
        } else {
            Policy::Coverage
        };
        Some(
            on_redis(cfg.interval_ms, policy, walk_ns).recovery(
                (self == Way::Pagewise).then_some(
                    Recovery::default()
                        .when(Pressure::LimitAbove(cfg.pressure_pct))
                        .zero_pages(cfg.zero_pages)
                        .tune_khugepaged(true)
                        .hold(Duration::from_secs(60)),
                ),
            ),
        )
    }

    /// The ways named in `names` (all where it is empty), each with the
    /// reason it cannot run here where it cannot; a name that is none of
    /// them is refused.
    pub fn chosen(names: &[String]) -> Result<(Vec<Way>, Vec<String>)> {
        let all = Way::all();
        if let Some(bad) = names
            .iter()
            .find(|n| !all.iter().any(|w| w.name() == n.as_str()))
        {
            let known: Vec<&str> = all.iter().map(|w| w.name()).collect();
            anyhow::bail!("--way {bad}: one of {}", known.join(", "));
        }
        let (mut ways, mut skipped) = (Vec::new(), Vec::new());
        for w in all {
            if !names.is_empty() && !names.iter().any(|n| n == w.name()) {
                continue;
            }
            match w.missing() {
                Some(why) => skipped.push(format!("{}: {why}", w.name())),
                None => ways.push(w),
            }
        }
        Ok((ways, skipped))
    }
}

/// The huge-page agent as the Redis experiments run it: a step every
/// `interval_ms` with a window of a quarter of it, `policy`, no budget of
/// huge pages (1,000 a second at most, half a CPU for the collapses), no
/// recovery.
pub(crate) fn on_redis(interval_ms: u64, policy: Policy, walk_ns: f64) -> Options {
    Options::default()
        .interval(Duration::from_millis(interval_ms))
        .window(Duration::from_millis(interval_ms / 4))
        .policy(policy)
        .budget(
            Budget::default()
                .total(None)
                .per_second(1000.0)
                .cpu_share(0.5),
        )
        .walk_ns(walk_ns)
        .recovery(None)
}
