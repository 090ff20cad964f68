//! The preload shim, from pagewise's side: where its file is, the
//! environment that tells it what to do ([`env`](mod@env): the whole contract), and
//! starting a program with it preloaded. The shim reads only the variables
//! of [`env`](mod@env); the capabilities that start programs under it (`track`,
//! `farmem`, `thp prezero`, `dedup`) do so through this module.

use crate::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::Duration;

/// The environment between pagewise and the preload shim: the whole contract.
/// Who sets each variable, who reads it, and its format.
pub mod env {
    /// Read by [`shim_path`](super::shim_path): the shim's path, instead of
    /// looking beside the running executable.
    pub const PRELOAD: &str = "PAGEWISE_PRELOAD";
    /// Set by [`start_tracked`](crate::track::start_tracked), read and removed by the
    /// shim at start-up: the decimal number of the shim's end of the
    /// socketpair that carries the [`protocol`](crate::track::protocol).
    pub const TRACK_FD: &str = "PAGEWISE_TRACK_FD";
    /// Set with [`TRACK_FD`]: the backend's name
    /// ([`BackendKind`](crate::track::BackendKind)'s `Display`, parsed back with `FromStr`).
    pub const TRACK_BACKEND: &str = "PAGEWISE_TRACK_BACKEND";
    /// Set by [`FarmemRun::command`](crate::farmem::FarmemRun::command): the instance
    /// to join (a file name under [`FARMEM_DIR`]). Its presence turns the
    /// shim's far-memory emulation on.
    pub const FARMEM_INSTANCE: &str = "PAGEWISE_FARMEM";
    /// The tag (decimal) that the members of one run share; the run reports
    /// and releases its members by it.
    pub const FARMEM_TAG: &str = "PAGEWISE_FARMEM_TAG";
    /// The eviction policy: a built-in name or the path of a plugin.
    pub const FARMEM_POLICY: &str = "PAGEWISE_FARMEM_POLICY";
    /// The plugin's argument string (empty for built-ins).
    pub const FARMEM_POLICY_ARGS: &str = "PAGEWISE_FARMEM_POLICY_ARGS";
    /// `1`: thread stacks are emulated too; anything else: they are not.
    pub const FARMEM_STACKS: &str = "PAGEWISE_FARMEM_STACKS";
    /// `thread` or `inline`: which thread serves faults (see
    /// [`crate::farmem::FaultPath`]).
    pub const FARMEM_FAULT_PATH: &str = "PAGEWISE_FARMEM_FAULT_PATH";
    /// A path: each member writes its event trace to `PATH.PID`.
    pub const FARMEM_TRACE: &str = "PAGEWISE_FARMEM_TRACE";
    /// A number N: a debug mode; each member checks its books against the
    /// page tables at every fault (every page of them every N faults) and
    /// stops the program at the first disagreement (see
    /// [`crate::farmem::Hooks::check_books`]). Slow.
    pub const FARMEM_CHECK: &str = "PAGEWISE_FARMEM_CHECK";
    /// Read by the library in every process: the directory of instance files
    /// (default `/dev/shm`).
    pub const FARMEM_DIR: &str = "PAGEWISE_FARMEM_DIR";
    /// Set by [`start_advised`](super::start_advised), read and removed by
    /// the shim at start-up: the decimal number of the shim's end of the
    /// socketpair that carries [`inject::shim`](crate::mech::inject::shim)'s
    /// requests.
    pub const ADVISE_FD: &str = "PAGEWISE_ADVISE_FD";
    /// Pre-zeroed huge pages in the program (`pagewise thp prezero`):
    /// `AHEAD,RATE` (huge pages kept ahead, most per second).
    pub const PREZERO: &str = "PAGEWISE_PREZERO";
}

/// The name of the preload shim's file.
pub const SHIM_FILE: &str = "libpagewise_preload.so";

/// The preload shim: [`env::PRELOAD`] if set, else the first of
/// `libpagewise_preload.so` beside the running executable, in its parent
/// directory, in `../lib`, and in the release directory of the source tree
/// this library was built from (for `cargo install --path crates/cli`).
pub fn shim_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env::PRELOAD) {
        return Ok(p.into());
    }
    let exe =
        std::env::current_exe().map_err(|e| Error::os("locating the running executable", e))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let candidates = [
        dir.join(SHIM_FILE),
        dir.join("..").join(SHIM_FILE),
        dir.join("../lib").join(SHIM_FILE),
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/release")
            .join(SHIM_FILE),
    ];
    candidates
        .into_iter()
        .find(|c| c.exists())
        .ok_or(Error::ShimNotFound { beside: exe })
}

/// The `LD_PRELOAD` value that puts the shim first, before whatever the
/// environment already preloads.
pub fn ld_preload() -> Result<String> {
    let mut preload = shim_path()?.display().to_string();
    if let Ok(old) = std::env::var("LD_PRELOAD") {
        if !old.is_empty() {
            preload = format!("{preload}:{old}");
        }
    }
    Ok(preload)
}

/// `cmd` (program and arguments) set up to start with the shim preloaded;
/// the caller adds the environment that tells the shim what to do.
pub fn shim_command(cmd: &[String]) -> Result<Command> {
    let program = cmd
        .first()
        .ok_or(Error::Invalid("no command to start".into()))?;
    let mut c = Command::new(program);
    c.args(&cmd[1..]).env("LD_PRELOAD", ld_preload()?);
    Ok(c)
}

/// `cmd` under the shim, started, with the shim's end of a new socketpair
/// passed in the environment variable `var` (and `extra` beside it);
/// returns the child and pagewise's end.
pub(crate) fn spawn_with_socket(
    cmd: &[String],
    var: &str,
    extra: &[(&str, &str)],
) -> Result<(Child, UnixStream)> {
    let program = cmd
        .first()
        .ok_or(Error::Invalid("no command to start".into()))?;
    let (mine, theirs) =
        UnixStream::pair().map_err(|e| Error::os("creating the shim's socket", e))?;
    let fd = theirs.as_raw_fd();
    let mut c = shim_command(cmd)?;
    c.env(var, fd.to_string());
    for (k, v) in extra {
        c.env(k, v);
    }
    // SAFETY: the closure only clears FD_CLOEXEC (fcntl, async-signal-safe)
    // on an fd that is open in the child.
    unsafe {
        c.pre_exec(move || pagewise_sys::process::clear_cloexec(fd));
    }
    let child = c
        .spawn()
        .map_err(|e| Error::os(format!("starting {program}"), e))?;
    drop(theirs);
    Ok((child, mine))
}

/// Starts `cmd` under the shim, which takes requests for advice inside it
/// ([`inject::shim`](super::inject::shim)), and waits (5 s at most) for
/// the shim's hello. Without one (a statically linked program, which loads
/// no shim, or one that ended at once) the child comes back alone, with
/// why: its advice must then be made under ptrace.
pub fn start_advised(
    cmd: &[String],
) -> Result<(
    Child,
    std::result::Result<super::inject::shim::ShimAdvice, String>,
)> {
    let (child, sock) = spawn_with_socket(cmd, env::ADVISE_FD, &[])?;
    let shim = super::inject::shim::ShimAdvice::hello(sock, Duration::from_secs(5))
        .map_err(|e| format!("its shim did not answer ({e}): statically linked, or it ended"));
    Ok((child, shim))
}
