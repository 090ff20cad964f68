//! Starting a program under pagewise: finding the preload shim, the
//! environment that tells it what to do, the socket of `track`, the
//! far-memory instance a run joins or creates, and the child's end.
//!
//! The command line, the benchmarks and the tests start programs only
//! through this module, and the shim reads only the variables of [`env`].

use crate::farmem::instance::{self, Access, Instance, Settings};
use crate::track::{protocol, BackendKind};
use crate::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::time::{Duration, Instant};

/// The environment between pagewise and the preload shim: the whole contract.
/// Who sets each variable, who reads it, and its format.
pub mod env {
    /// Read by [`shim_path`](super::shim_path): the shim's path, instead of
    /// looking beside the running executable.
    pub const PRELOAD: &str = "PAGEWISE_PRELOAD";
    /// Set by [`start_tracked`](super::start_tracked), read and removed by the
    /// shim at start-up: the decimal number of the shim's end of the
    /// socketpair that carries the [`protocol`](crate::track::protocol).
    pub const TRACK_FD: &str = "PAGEWISE_TRACK_FD";
    /// Set with [`TRACK_FD`]: the backend's name
    /// ([`BackendKind`](crate::track::BackendKind)'s `Display`, parsed back with `FromStr`).
    pub const TRACK_BACKEND: &str = "PAGEWISE_TRACK_BACKEND";
    /// Set by [`FarmemRun::command`](super::FarmemRun::command): the instance
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
    /// socketpair that carries [`inject::shim`](crate::inject::shim)'s
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

/// A program started with the shim tracking its writes (see [`start_tracked`]).
pub enum Tracked {
    /// Running, the shim answered: the socket to send requests on and the
    /// backend the shim uses.
    Running(Child, UnixStream, BackendKind),
    /// It ended before the shim could answer: its status.
    Over(ExitStatus),
}

/// `cmd` under the shim, started, with the shim's end of a new socketpair
/// passed in the environment variable `var` (and `extra` beside it);
/// returns the child and pagewise's end.
fn spawn_with_socket(
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
/// ([`inject::shim`](crate::inject::shim)), and waits (5 s at most) for
/// the shim's hello. Without one (a statically linked program, which loads
/// no shim, or one that ended at once) the child comes back alone, with
/// why: its advice must then be made under ptrace.
pub fn start_advised(
    cmd: &[String],
) -> Result<(
    Child,
    std::result::Result<crate::inject::shim::ShimAdvice, String>,
)> {
    let (child, sock) = spawn_with_socket(cmd, env::ADVISE_FD, &[])?;
    let shim = crate::inject::shim::ShimAdvice::hello(sock, Duration::from_secs(5))
        .map_err(|e| format!("its shim did not answer ({e}): statically linked, or it ended"));
    Ok((child, shim))
}

/// Starts `cmd` with the shim preloaded and tracking its writes with
/// `backend`, and waits (10 s at most) for the shim's hello.
pub fn start_tracked(cmd: &[String], backend: BackendKind) -> Result<Tracked> {
    let (mut child, mut s) =
        spawn_with_socket(cmd, env::TRACK_FD, &[(env::TRACK_BACKEND, backend.name())])?;
    let program = &cmd[0];
    let hello = s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .and_then(|_| protocol::hello(&mut s));
    match hello {
        Ok(got) => {
            s.set_read_timeout(Some(Duration::from_secs(60)))
                .map_err(|e| Error::os("setting the shim socket's timeout", e))?;
            Ok(Tracked::Running(child, s, got))
        }
        // Over before the shim could answer: its status is the answer.
        Err(_) if let Some(st) = wait_for(&mut child, Duration::from_millis(500)) => {
            Ok(Tracked::Over(st))
        }
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(Error::ShimSilent {
                program: program.clone(),
                source: e,
            })
        }
    }
}

/// How the members of a far-memory run behave (see [`FarmemRun::command`]).
#[derive(Clone, Debug)]
pub struct FarmemOptions {
    /// The eviction policy: a built-in name or a plugin's path.
    pub policy: String,
    /// The plugin's argument string.
    pub policy_args: String,
    /// Emulate thread stacks too.
    pub stacks: bool,
    /// Write each member's trace to `PATH.PID`.
    pub trace: Option<PathBuf>,
    /// Which thread serves faults.
    pub fault_path: crate::farmem::FaultPath,
}

impl Default for FarmemOptions {
    fn default() -> Self {
        FarmemOptions {
            policy: "fifo".into(),
            policy_args: String::new(),
            stacks: false,
            trace: None,
            // As `farmem run`'s default.
            fault_path: crate::farmem::FaultPath::Inline,
        }
    }
}

/// The instance one run of programs under far-memory emulation uses, and the
/// tag (this process's id) its members carry.
pub struct FarmemRun {
    inst: Instance,
    tag: u32,
}

impl FarmemRun {
    /// Joins the instance `name` if it exists, or creates it (`name`, or a
    /// fresh name starting with `prefix`) with `want`, calibrating the fault
    /// floor first. Joining with settings other than the instance's is
    /// refused; `want: None` only joins. Instances whose processes all died
    /// are swept first.
    pub fn join_or_create(
        name: Option<&str>,
        prefix: &str,
        want: Option<Settings>,
    ) -> Result<Self> {
        Instance::sweep();
        let tag = std::process::id();
        if let Some(n) = name.filter(|n| instance::exists(n)) {
            let inst = Instance::open(n, Access::Join)?;
            if let Some(w) = want {
                let s = inst.settings();
                let budget_differs =
                    (w.local_pages, w.local_percent) != (s.local_pages, s.local_percent);
                let link_differs =
                    (w.latency_ns, w.bandwidth_bps) != (s.latency_ns, s.bandwidth_bps);
                if budget_differs || link_differs {
                    return Err(Error::InstanceConflict { name: n.into() });
                }
            }
            return Ok(FarmemRun { inst, tag });
        }
        let Some(want) = want else {
            return Err(Error::Invalid(format!(
                "instance {} does not exist: give its settings to create it",
                name.unwrap_or(prefix)
            )));
        };
        want.check()?;
        let name = name
            .map(str::to_string)
            .unwrap_or_else(|| instance::unpredictable_name(prefix));
        use crate::farmem::FaultPath;
        let cal = crate::farmem::calibrate(2000, FaultPath::Thread)?;
        // The inline path where the kernel has it (else it is never used).
        let inline = if crate::probe::get().uffd_has(pagewise_sys::uffd::feature::SIGBUS) {
            crate::farmem::calibrate(2000, FaultPath::Inline)?
        } else {
            cal
        };
        let inst = match Instance::create(
            &name,
            want,
            (cal.floor_ns, cal.unseen_ns),
            (inline.floor_ns, inline.unseen_ns),
        ) {
            Ok(i) => i,
            // Another run created it meanwhile: join it.
            Err(_) if instance::exists(&name) => Instance::open(&name, Access::Join)?,
            Err(e) => return Err(e),
        };
        Ok(FarmemRun { inst, tag })
    }

    /// A private instance (fresh name from `prefix`) that only watches:
    /// latency 0 and a budget nothing reaches, no calibration. For sampling
    /// which pages a program touches.
    pub fn watch_only(prefix: &str) -> Result<Self> {
        Instance::sweep();
        let settings = Settings {
            latency_ns: 0,
            bandwidth_bps: 0,
            local_pages: 1 << 40,
            local_percent: 0,
        };
        let inst = Instance::create(
            &instance::unpredictable_name(prefix),
            settings,
            (0, 0),
            (0, 0),
        )?;
        Ok(FarmemRun {
            inst,
            tag: std::process::id(),
        })
    }

    /// The instance.
    pub fn instance(&self) -> &Instance {
        &self.inst
    }

    /// The tag this run's members carry.
    pub fn tag(&self) -> u32 {
        self.tag
    }

    /// `cmd` set up to run under the shim as a member of this run.
    pub fn command(&self, cmd: &[String], opts: &FarmemOptions) -> Result<Command> {
        let mut c = shim_command(cmd)?;
        c.env(env::FARMEM_INSTANCE, self.inst.name())
            .env(env::FARMEM_TAG, self.tag.to_string())
            .env(env::FARMEM_POLICY, &opts.policy)
            .env(env::FARMEM_POLICY_ARGS, &opts.policy_args)
            .env(env::FARMEM_STACKS, if opts.stacks { "1" } else { "0" })
            .env(env::FARMEM_FAULT_PATH, opts.fault_path.to_string());
        if let Some(t) = &opts.trace {
            c.env(env::FARMEM_TRACE, t);
        }
        Ok(c)
    }

    /// Members of this run that died without leaving (killed) leave now.
    pub fn reap_dead_members(&self) {
        for m in self.inst.members() {
            if m.tag == self.tag && !crate::procfs::is_alive(m.pid) {
                self.inst.leave_pid(m.pid);
            }
        }
    }

    /// Ends the run: reaps dead members, frees the slots its departed
    /// members kept for their counts, and removes the instance if no live
    /// member is left (the last one out; another may have done so).
    pub fn finish(self) {
        self.reap_dead_members();
        self.inst.release_retired(self.tag);
        if self.inst.members().iter().all(|m| !m.live) {
            let _ = self.inst.remove();
        }
    }
}

impl FarmemRun {
    /// Removes the instance, whatever members it still has (a private
    /// instance whose program was stopped).
    pub fn remove(self) {
        let _ = self.inst.remove();
    }
}

/// Waits up to `within` for `child` to end on its own; its status, or `None`
/// if it is still running.
pub fn wait_for(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let t0 = Instant::now();
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        if t0.elapsed() >= within {
            return None;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits up to `within` for `child` to exit (after it was asked to), then
/// kills it; reaps it either way.
pub fn wait_or_kill(child: &mut Child, within: Duration) {
    if wait_for(child, within).is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Asks `child` to stop (SIGTERM), waits up to `within`, then kills it.
pub fn stop(child: &mut Child, within: Duration) {
    let _ = pagewise_sys::process::kill(child.id() as i32, libc::SIGTERM);
    wait_or_kill(child, within);
}

/// The status a tool that ran a command reports as its own, like `time` and
/// `strace`: the command's exit code, or 128 + the signal that killed it.
pub fn exit_code(st: ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code().unwrap_or_else(|| 128 + st.signal().unwrap_or(0))
}
