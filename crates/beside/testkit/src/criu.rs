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

/// `criu dump` of `pid` into the page server at 127.0.0.1:`port`, the
/// dump's other images and its log (`dump.log`) in `images` (made if
/// missing), with `extra` options (`--leave-running`, `-v4`); how long it
/// took. `Err`: its status and the last lines of its log.
pub fn dump_to_page_server(
    criu: &std::path::Path,
    pid: u32,
    images: &std::path::Path,
    port: u16,
    extra: &[&str],
) -> Result<std::time::Duration, String> {
    dump(criu, pid, images, Some(port), extra)
}

/// `criu dump` of `pid` with every image (its pages too) and its log
/// (`dump.log`) in `images`, as [`dump_to_page_server`] says.
pub fn dump_to_dir(
    criu: &std::path::Path,
    pid: u32,
    images: &std::path::Path,
    extra: &[&str],
) -> Result<std::time::Duration, String> {
    dump(criu, pid, images, None, extra)
}

fn dump(
    criu: &std::path::Path,
    pid: u32,
    images: &std::path::Path,
    port: Option<u16>,
    extra: &[&str],
) -> Result<std::time::Duration, String> {
    std::fs::create_dir_all(images).map_err(|e| format!("{}: {e}", images.display()))?;
    let t0 = std::time::Instant::now();
    let mut c = Command::new(criu);
    c.args(["dump", "-t", &pid.to_string()]);
    if let Some(port) = port {
        c.args([
            "--page-server",
            "--address",
            "127.0.0.1",
            "--port",
            &port.to_string(),
        ]);
    }
    let st = c
        .args(extra)
        .args(["-o", "dump.log", "-D"])
        .arg(images)
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("criu dump: {e}"))?;
    let took = t0.elapsed();
    if !st.success() {
        let log = std::fs::read_to_string(images.join("dump.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        return Err(format!("criu dump: {st}; its log ends: {tail:#?}"));
    }
    Ok(took)
}

/// A process `criu restore -d` started: killed on drop, and waited for
/// (10 s at most) until it is gone, its pid and ports free again.
#[derive(Debug)]
pub struct Restored(pub u32);

impl Drop for Restored {
    fn drop(&mut self) {
        let pid = self.0 as i32;
        let _ = pagewise_sys::process::kill(pid, libc::SIGKILL);
        let t0 = std::time::Instant::now();
        while std::path::Path::new(&format!("/proc/{pid}")).exists()
            && t0.elapsed() < std::time::Duration::from_secs(10)
        {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

/// `criu restore -d -D images` with `extra` options (`--lazy-pages`,
/// `-v4`), its log in `images/restore.log`: the process it restored (the
/// dump's pid, `pid`) and how long the command took. `Err`: its status
/// and the last lines of its log.
pub fn restore(
    criu: &std::path::Path,
    images: &std::path::Path,
    extra: &[&str],
    pid: u32,
) -> Result<(Restored, std::time::Duration), String> {
    let t0 = std::time::Instant::now();
    let st = Command::new(criu)
        .arg("restore")
        .args(extra)
        .args(["-d", "-o", "restore.log", "-D"])
        .arg(images)
        .stderr(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("criu restore: {e}"))?;
    let took = t0.elapsed();
    if !st.success() {
        let log = std::fs::read_to_string(images.join("restore.log")).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(15).collect();
        return Err(format!(
            "criu restore {extra:?} of {}: {st}; its log ends: {tail:#?}",
            images.display()
        ));
    }
    Ok((Restored(pid), took))
}

/// Waits (10 s at most) until a socket listens on loopback port `port`,
/// as /proc/net/tcp lists it: CRIU's page server serves one connection,
/// so it cannot be probed by connecting. `Err`: what it waited for.
pub fn wait_listening(port: u16) -> Result<(), String> {
    let t0 = std::time::Instant::now();
    let want = format!(":{port:04X} ");
    loop {
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
        if tcp
            .lines()
            .any(|l| l.split_whitespace().nth(3) == Some("0A") && l.contains(&want))
        {
            return Ok(());
        }
        if t0.elapsed().as_secs() >= 10 {
            return Err(format!("nothing listens on port {port} after 10 s"));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
