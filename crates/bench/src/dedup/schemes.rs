//! The schemes `bench dedup` compares, and the agent each runs.

use super::Config;
use pagewise::dedup::{Options, Policy};
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

/// The agent a scheme runs (`None`: no deduplication): the four policies
/// with ksmd paced by the agent (one pass in [`Config::full_scan_ms`],
/// smart scan off), and KSM everywhere paced by the kernel's advisor
/// instead, with smart scan on as the kernel ships it: at the advisor's
/// default target (`ksm-advisor`) and at the run's own pace
/// (`ksm-advisor-tuned`, the target the agents' pacing has).
pub(super) fn scheme_options(cfg: &Config, scheme: &str) -> Option<Options> {
    let base = Options::default().window(Duration::from_millis(cfg.window_ms));
    let advised = |target: Duration| {
        base.clone()
            .policy(Policy::KsmEverywhere)
            .full_scan(None)
            .advisor(Some(target))
            .smart_scan(Some(true))
    };
    match scheme {
        "ksm-advisor" => Some(advised(ADVISOR_DEFAULT)),
        "ksm-advisor-tuned" => Some(advised(Duration::from_millis(cfg.full_scan_ms))),
        _ => Some(
            base.clone()
                .policy(Policy::parse(scheme)?)
                .full_scan(Some(Duration::from_millis(cfg.full_scan_ms))),
        ),
    }
}

/// Refuses a scheme not in [`SCHEMES`].
pub fn check_schemes(schemes: &[String]) -> std::result::Result<(), String> {
    match schemes.iter().find(|s| !SCHEMES.contains(&s.as_str())) {
        Some(bad) => Err(format!("--scheme {bad}: one of {SCHEMES:?}")),
        None => Ok(()),
    }
}
