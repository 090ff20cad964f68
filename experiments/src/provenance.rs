//! Where, when and how a result was measured, recorded in every
//! `report.json` the benchmarks write (`Output::emit` adds it): the git
//! commit of the tree, the exact command line, the start and end in UTC,
//! the host (CPU model, vCPUs, memory, kernel release and build) and the
//! one-minute load average at the start and at the end.

use crate::Machine;
use serde::Serialize;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Provenance of a result.
#[derive(Debug, Clone, Serialize)]
pub struct Provenance {
    /// `git rev-parse --short HEAD` of the tree the benchmark ran from
    /// (`PAGEWISE_COMMIT` at build time wins), with `-dirty` when it had
    /// changes not committed; `None` outside a git tree.
    pub commit: Option<String>,
    /// The command line, as typed.
    pub command: String,
    /// When the run started, UTC (RFC 3339).
    pub started: String,
    /// When the report was written, UTC (RFC 3339).
    pub ended: String,
    /// The machine.
    pub host: Machine,
    /// The kernel's build (`/proc/sys/kernel/version`).
    pub kernel_build: String,
    /// The one-minute load average at the start and at the end.
    pub load: (f64, f64),
}

/// When the run began, the load then, and the tree's commit then (the
/// tree may change while a long run goes on: the binary is the start's).
static START: OnceLock<(SystemTime, f64, Option<String>)> = OnceLock::new();

/// Notes the start of the run (the first call counts).
pub fn begin() {
    START.get_or_init(|| (SystemTime::now(), load(), commit()));
}

/// The provenance of a result written now.
pub fn now() -> Provenance {
    begin();
    let (t0, load0, commit) = START.get().cloned().expect("set by begin");
    Provenance {
        commit,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        started: rfc3339(t0),
        ended: rfc3339(SystemTime::now()),
        host: Machine::this(),
        kernel_build: std::fs::read_to_string("/proc/sys/kernel/version")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
        load: (load0, load()),
    }
}

/// The one-minute load average.
pub fn load() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The commit of the tree (see [`Provenance::commit`]).
pub fn commit() -> Option<String> {
    if let Some(c) = option_env!("PAGEWISE_COMMIT") {
        return Some(c.to_string());
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short", "HEAD"])?;
    let dirty =
        git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{head}-dirty") } else { head })
}

/// `t` as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn dates_are_civil() {
        let at = |s: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(s));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(at(1_795_699_421), "2026-11-26T13:23:41Z");
        assert_eq!(at(4_107_542_399), "2100-02-28T23:59:59Z");
    }
}
