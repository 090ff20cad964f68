//! Containers for tests: a program run by podman with the runtime's
//! defaults (its seccomp profile, its capabilities), from the host's `/usr`
//! mounted read-only into an empty root, so that no image is needed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Piped;

/// Why podman cannot run containers here, if so (podman and runc
/// installed, and root).
pub fn podman_missing() -> Option<String> {
    for tool in ["podman", "runc"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false)
            || Path::new("/usr/sbin").join(tool).is_file();
        if !found {
            return Some(format!(
                "podman and runc are needed to run containers ({tool} is not installed)"
            ));
        }
    }
    let euid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("Uid:"))?;
            l.split_whitespace().nth(2)?.parse::<u32>().ok()
        });
    if euid != Some(0) {
        return Some("podman containers are started as root here".into());
    }
    None
}

/// The empty root a container runs in (the host's `/usr` is mounted over
/// its `usr`), made once under `tmp`.
fn root(tmp: &Path) -> PathBuf {
    let root = tmp.join("container-root");
    for d in ["usr", "etc", "tmp", "proc", "sys", "dev", "run", "t"] {
        std::fs::create_dir_all(root.join(d)).expect("making the container's root");
    }
    for l in ["bin", "lib", "lib64", "sbin"] {
        let _ = std::os::unix::fs::symlink(format!("usr/{l}"), root.join(l));
    }
    root
}

/// `podman run` of `program` with `args`: the runtime's defaults, read-only,
/// without a network, `dir` mounted read-only at `/t`, `env` set; `tmp` is
/// where the empty root is made. `runc`: Debian's crun refuses hybrid
/// cgroups; runc needs its limits said.
pub fn podman_run(
    tmp: &Path,
    name: &str,
    dir: &Path,
    env: &[(&str, &str)],
    program: &str,
    args: &[&str],
) -> Command {
    let more: Vec<String> = env
        .iter()
        .flat_map(|(k, v)| ["-e".to_string(), format!("{k}={v}")])
        .collect();
    podman_run_with(tmp, name, dir, &more, program, args)
}

/// [`podman_run`] with `more` arguments of `podman run` (volumes,
/// environment, a user) instead of an environment.
pub fn podman_run_with(
    tmp: &Path,
    name: &str,
    dir: &Path,
    more: &[String],
    program: &str,
    args: &[&str],
) -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "run", "-i", "--rm", "--name", name])
        .args(["--read-only", "--network", "none"])
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=4096:4096",
        ])
        .args(["-v", "/usr:/usr:ro"])
        .arg("-v")
        .arg(format!("{}:/t:ro", dir.display()));
    c.args(more);
    c.arg("--rootfs").arg(root(tmp)).arg(program).args(args);
    c
}

/// The host pid of the first process of running container `name`.
pub fn host_pid(name: &str) -> i32 {
    let out = Command::new("podman")
        .args(["inspect", "--format", "{{.State.Pid}}", name])
        .output()
        .expect("running podman inspect");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("the container's pid")
}

/// A container running one program with stdin and stdout piped; removed
/// when dropped.
pub struct Container {
    /// Its name.
    pub name: String,
    /// Its program's stdin and stdout (through podman).
    pub p: Piped,
    /// The program's pid on the host.
    pub pid: i32,
    /// The program's first line (`ready…`).
    pub ready: String,
}

impl Drop for Container {
    fn drop(&mut self) {
        drop(Removed(self.name.clone()));
    }
}

/// Removes the container of this name when dropped (`podman rm -f`).
pub struct Removed(pub String);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "-f", "-t", "0", &self.0])
            .output();
    }
}

impl Container {
    /// Runs `/t/PROGRAM` (`program`, a file of `dir`) with `args` (see
    /// [`podman_run`]); waits for its first line, which must start with
    /// `ready`.
    pub fn start(tmp: &Path, dir: &Path, program: &str, args: &[&str]) -> Container {
        Self::start_with(tmp, dir, program, args, &[])
    }

    /// [`start`](Self::start) with `more` arguments of `podman run` (a
    /// user, say); the container is named after them too.
    pub fn start_with(
        tmp: &Path,
        dir: &Path,
        program: &str,
        args: &[&str],
        more: &[String],
    ) -> Container {
        let tag: String = more
            .concat()
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .collect();
        let name = format!("pagewise-test-{}-{program}{tag}", std::process::id());
        let mut c = podman_run_with(tmp, &name, dir, more, &format!("/t/{program}"), args);
        let mut p = Piped::start(&mut c);
        let l = p.line();
        assert!(l.starts_with("ready"), "the container's program said {l:?}");
        let pid = host_pid(&name);
        Container {
            name,
            p,
            pid,
            ready: l,
        }
    }
}

/// A container named after `tag` (and this process) running the shell
/// `script`, which says `ready` first; removed when the [`Removed`] is
/// dropped. `None`, a skip said, where podman cannot run containers.
pub fn shell(tmp: &Path, tag: &str, script: &str) -> Option<(String, Removed, Piped)> {
    shell_with(tmp, tag, script, &[])
}

/// [`shell`] with `more` arguments of `podman run`.
pub fn shell_with(
    tmp: &Path,
    tag: &str,
    script: &str,
    more: &[String],
) -> Option<(String, Removed, Piped)> {
    if let Some(why) = podman_missing() {
        crate::skip!("{why}");
        return None;
    }
    let name = format!("pagewise-test-{}-{tag}", std::process::id());
    let gone = Removed(name.clone());
    let mut run = podman_run_with(tmp, &name, tmp, more, "/bin/sh", &["-c", script]);
    let mut p = Piped::start(&mut run);
    assert_eq!(p.line(), "ready");
    Some((name, gone, p))
}
