//! CRIU itself, for the tests of pagewise's page server: v4.2, built by
//! `scripts/setup.sh` from the source the project is given (Debian's
//! criu 3.17 does not run on this kernel).

use std::path::PathBuf;
use std::process::Command;

/// The CRIU 4.x binary to test against: `PAGEWISE_CRIU`, or the one
/// `scripts/setup.sh` builds (`~/.cache/pagewise/criu-4.2/criu/criu`),
/// checked to be 4.x and to pass `criu check` here. `Err`: why not, a
/// reason that names "criu" (for a skip).
pub fn criu4() -> Result<PathBuf, String> {
    let bin = match std::env::var_os("PAGEWISE_CRIU") {
        Some(p) => PathBuf::from(p),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
                .ok_or("criu 4.2: no HOME to find its build in")?;
            cache.join("pagewise/criu-4.2/criu/criu")
        }
    };
    if !bin.is_file() {
        return Err(format!(
            "criu 4.2 is not built at {} (scripts/setup.sh builds it from ../shared/thirdparty)",
            bin.display()
        ));
    }
    let v = Command::new(&bin)
        .arg("--version")
        .output()
        .map_err(|e| format!("criu at {}: {e}", bin.display()))?;
    let version = String::from_utf8_lossy(&v.stdout).to_string();
    if !version.contains("Version: 4.") {
        return Err(format!("criu at {} is not 4.x: {version}", bin.display()));
    }
    if !crate::is_root() {
        return Err("criu needs root to dump and restore".into());
    }
    let check = Command::new(&bin)
        .arg("check")
        .output()
        .map_err(|e| format!("criu check: {e}"))?;
    let said = String::from_utf8_lossy(&check.stdout).to_string()
        + &String::from_utf8_lossy(&check.stderr);
    if !check.status.success() || !said.contains("Looks good") {
        return Err(format!("criu check fails here: {}", said.trim()));
    }
    Ok(bin)
}
