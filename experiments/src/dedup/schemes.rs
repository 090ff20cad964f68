//! The schemes `bench dedup` compares, and the agent each runs.

use pagewise_dedup::{Options, Policy};
use std::time::Duration;

/// The schemes, in the order they run.
pub const SCHEMES: [&str; 7] = [
    "none",
    "ksm-everywhere",
    "ksm-advisor",
    "ksm-advisor-tuned",
    "no-splitting",
    "ingens-like",
    "smartmd",
];

/// The kernel advisor's default target for one pass over the mergeable
/// pages (`advisor_target_scan_time`).
const ADVISOR_DEFAULT: Duration = Duration::from_secs(200);

/// The agent a scheme runs (`None`: no deduplication), with `window` for
/// its access window: the four policies with ksmd paced by the agent (one
/// pass in `full_scan`, smart scan off), and KSM everywhere paced by the kernel's advisor
/// instead, with smart scan on as the kernel ships it: at the advisor's
/// default target (`ksm-advisor`) and at the run's own pace
/// (`ksm-advisor-tuned`, the target the agents' pacing has).
pub(crate) fn scheme_options(
    scheme: &str,
    window: Duration,
    full_scan: Duration,
) -> Option<Options> {
    let base = Options::default().window(window);
    let advised = |target: Duration| {
        base.clone()
            .policy(Policy::KsmEverywhere)
            .full_scan(None)
            .advisor(Some(target))
            .smart_scan(Some(true))
    };
    match scheme {
        "ksm-advisor" => Some(advised(ADVISOR_DEFAULT)),
        "ksm-advisor-tuned" => Some(advised(full_scan)),
        _ => Some(
            base.clone()
                .policy(Policy::parse(scheme)?)
                .full_scan(Some(full_scan)),
        ),
    }
}

/// Why this kernel cannot run `scheme` (the advisor's need Linux 6.9+),
/// or `None`.
pub(crate) fn scheme_unavailable(scheme: &str) -> Option<String> {
    let p = pagewise_mech::probe::get();
    (scheme.starts_with("ksm-advisor") && !p.ksm_advisor)
        .then(|| format!("{scheme}: {}", p.why("ksm.advisor")))
}

/// Refuses a scheme not in [`SCHEMES`].
pub fn check_schemes(schemes: &[String]) -> std::result::Result<(), String> {
    match schemes.iter().find(|s| !SCHEMES.contains(&s.as_str())) {
        Some(bad) => Err(format!("--scheme {bad}: one of {SCHEMES:?}")),
        None => Ok(()),
    }
}
