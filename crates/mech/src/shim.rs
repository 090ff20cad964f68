//! The contract between pagewise and its preload shim, and the shim from
//! pagewise's side: where its file is and starting a program with it.
//!
//! Everything the two must agree on is versioned by one number,
//! [`CONTRACT`]:
//!
//! - **the environment** ([`env`](mod@env)): what pagewise asks of the shim. It
//!   is written in one place ([`ShimRequest::apply`]) and read in one place
//!   ([`ShimRequest::from_env`]), which also checks [`env::CONTRACT`];
//! - **the hellos** the shim sends first on its sockets: the tracking
//!   socket (`track::protocol`, magic `PGWS`) and the advice socket
//!   ([`super::inject::shim`], magic `PGWA`) both begin with their magic and
//!   the contract ([`hello_header`], checked by [`check_hello`]);
//! - **the far-memory instance files** the shim joins (`farmem::instance`,
//!   whose layout has its own version, checked on every open).
//!
//! A shim and a tool of different contracts refuse each other with one
//! line: the shim, reading a contract other than its own in the
//! environment, does nothing that was asked and says so (and answers a
//! socket's hello with its own contract and `EPROTO`); the tool, reading a
//! hello of another contract, says which it got and which it speaks. Bump
//! [`CONTRACT`] with any change to the environment, the hellos or the
//! messages that follow them.

use crate::{Error, Result};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// The version of everything pagewise and the preload shim must agree on
/// (see the module). 3: the first contract carried by both hellos and the
/// environment; 4: the pre-zeroing report; 5: pre-zeroing kept across the
/// program's `exec` (the request's owner).
pub const CONTRACT: u32 = 5;

/// The package version of this build, said beside the contract.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// The environment between pagewise and the preload shim. Who sets each
/// variable, who reads it, and its format.
pub mod env {
    /// Set with every request ([`ShimRequest::apply`](super::ShimRequest::apply)),
    /// inherited by the program's children: `CONTRACT BUILD` of the
    /// pagewise that asked. A shim of another contract does nothing asked.
    pub const CONTRACT: &str = "PAGEWISE_CONTRACT";
    /// Read by [`shim_path`](super::shim_path): the shim's path, instead of
    /// looking beside the running executable.
    pub const PRELOAD: &str = "PAGEWISE_PRELOAD";
    /// Set by `pagewise::track::start_tracked`, read and removed by the
    /// shim at start-up: the decimal number of the shim's end of the
    /// socketpair that carries the `pagewise::track::protocol`.
    pub const TRACK_FD: &str = "PAGEWISE_TRACK_FD";
    /// Set with [`TRACK_FD`]: the backend's name
    /// (`pagewise::track::BackendKind`'s `Display`, parsed back with `FromStr`).
    pub const TRACK_BACKEND: &str = "PAGEWISE_TRACK_BACKEND";
    /// Set by `pagewise::farmem::FarmemRun::command`: the instance
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
    /// `pagewise::farmem::FaultPath`).
    pub const FARMEM_FAULT_PATH: &str = "PAGEWISE_FARMEM_FAULT_PATH";
    /// A path: each member writes its event trace to `PATH.PID`.
    pub const FARMEM_TRACE: &str = "PAGEWISE_FARMEM_TRACE";
    /// A number N: a debug mode; each member checks its books against the
    /// page tables at every fault (every page of them every N faults) and
    /// stops the program at the first disagreement (see
    /// `pagewise::farmem::Hooks::check_books`). Slow.
    pub const FARMEM_CHECK: &str = "PAGEWISE_FARMEM_CHECK";
    /// Read by the library in every process: the directory of instance files
    /// (default `/dev/shm`).
    pub const FARMEM_DIR: &str = "PAGEWISE_FARMEM_DIR";
    /// Set by [`start_advised`](crate::inject::shim::start_advised), read and removed by
    /// the shim at start-up: the decimal number of the shim's end of the
    /// socketpair that carries [`inject::shim`](crate::inject::shim)'s
    /// requests.
    pub const ADVISE_FD: &str = "PAGEWISE_ADVISE_FD";
    /// Pre-zeroed huge pages in the program (`pagewise thp prezero`):
    /// `AHEAD,RATE,FD` (huge pages kept ahead, most per second, and the
    /// decimal number of the shim's end of the socketpair its report goes
    /// to as the program exits; any may be empty). The shim that takes the
    /// request writes it back as `AHEAD,RATE,,PID:START` (its process's
    /// pid and start time, [`crate::procfs::start_time`]), so that
    /// the program after an `exec` (the same process) is pre-zeroed again,
    /// without a report (the socket closed at the `exec`), and its
    /// children (other processes) are not.
    pub const PREZERO: &str = "PAGEWISE_PREZERO";
}

/// The name of the preload shim's file.
pub const SHIM_FILE: &str = "libpagewise_preload.so";

/// The preload shim: [`env::PRELOAD`] if set, else the first of
/// `libpagewise_preload.so` beside the running executable, in its parent
/// directory, in `../lib/pagewise` (where `make install` and the Debian
/// package put it: `PREFIX/bin` and `PREFIX/lib/pagewise`), in `../lib`,
/// and in the release directory of the source tree this library was built
/// from (for `cargo install --path crates/cli`, which installs no shim).
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
        dir.join("../lib/pagewise").join(SHIM_FILE),
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

/// `cmd` (program and arguments) set up to start with the shim preloaded
/// and [tied](crate::child::tie) to the starting thread; the caller
/// adds the environment that tells the shim what to do.
pub fn shim_command(cmd: &[String]) -> Result<Command> {
    let program = cmd
        .first()
        .ok_or(Error::Invalid("no command to start".into()))?;
    let mut c = Command::new(program);
    c.args(&cmd[1..]).env("LD_PRELOAD", ld_preload()?);
    crate::child::tie(&mut c);
    Ok(c)
}

/// `cmd` under the shim, started, with the shim's end of a new socketpair
/// passed to it in the request `ask` makes of its fd number, and the
/// command set up further by `setup` (its standard streams, say); returns
/// the child and pagewise's end.
pub fn spawn_with_socket(
    cmd: &[String],
    ask: impl FnOnce(i32) -> ShimRequest,
    setup: impl FnOnce(&mut Command),
) -> Result<(Child, UnixStream)> {
    let program = cmd
        .first()
        .ok_or(Error::Invalid("no command to start".into()))?;
    let (mine, theirs) =
        UnixStream::pair().map_err(|e| Error::os("creating the shim's socket", e))?;
    let fd = theirs.as_raw_fd();
    let mut c = shim_command(cmd)?;
    ask(fd).apply(&mut c);
    setup(&mut c);
    pagewise_sys::process::keep_fd_across_exec(&mut c, fd);
    let child = c
        .spawn()
        .map_err(|e| Error::os(format!("starting {program}"), e))?;
    drop(theirs);
    Ok((child, mine))
}

/// What pagewise asks of the shim in one program, as the environment
/// carries it (see [`env`](mod@env) for each variable).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShimRequest {
    /// Track the program's writes, serving the socket at this fd, with the
    /// backend of this name.
    pub track: Option<(i32, String)>,
    /// Make the `madvise` calls asked on the socket at this fd.
    pub advise: Option<i32>,
    /// Emulate far memory as a member of a run.
    pub farmem: Option<FarmemRequest>,
    /// Pre-zero huge pages ahead of the program's growing memory.
    pub prezero: Option<PrezeroRequest>,
}

/// Far-memory emulation asked of the shim (see `farmem::FarmemRun`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FarmemRequest {
    /// The instance to join.
    pub instance: String,
    /// The tag the run's members share.
    pub tag: u32,
    /// The eviction policy: a built-in name or a plugin's path.
    pub policy: String,
    /// The plugin's argument string.
    pub policy_args: String,
    /// Emulate thread stacks too.
    pub stacks: bool,
    /// `thread` or `inline` (empty: the engine's default).
    pub fault_path: String,
    /// Each member writes its event trace to `PATH.PID`.
    pub trace: Option<PathBuf>,
    /// The books checked against the page tables every N faults (0: not):
    /// read from pagewise's own environment and passed on.
    pub check: u64,
}

/// Pre-zeroing asked of the shim (`pagewise thp prezero`); `None` fields
/// take the library's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PrezeroRequest {
    /// Huge pages kept ahead.
    pub ahead: Option<u64>,
    /// Most huge pages zeroed per second.
    pub rate: Option<f64>,
    /// The shim's end of a socketpair on which it sends its report
    /// (`pagewise::thp::prezero::PrezeroStats::encode`) as the program exits.
    pub report: Option<i32>,
}

impl PrezeroRequest {
    /// The value of [`env::PREZERO`] that asks for this, for the process
    /// `owner` names where it is given.
    fn spec(&self, owner: Option<&str>) -> String {
        let part = |v: Option<String>| v.unwrap_or_default();
        let mut s = format!(
            "{},{},{}",
            part(self.ahead.map(|a| a.to_string())),
            part(self.rate.map(|r| r.to_string())),
            part(self.report.map(|f| f.to_string()))
        );
        if let Some(o) = owner {
            s.push(',');
            s.push_str(o);
        }
        s
    }
}

/// This process, as the owner of a pre-zeroing request names it
/// (`PID:START`, see [`env::PREZERO`]).
fn this_process() -> String {
    let pid = std::process::id();
    let start = super::procfs::start_time(pid as i32).unwrap_or(0);
    format!("{pid}:{start}")
}

/// The variables a program's children must not inherit: their sockets are
/// the program's, and pre-zeroing is asked for it alone.
const NOT_INHERITED: [&str; 4] = [
    env::TRACK_FD,
    env::TRACK_BACKEND,
    env::ADVISE_FD,
    env::PREZERO,
];

impl ShimRequest {
    /// Sets the environment of `c` that asks for this, with the contract.
    pub fn apply(&self, c: &mut Command) {
        c.env(env::CONTRACT, format!("{CONTRACT} {BUILD}"));
        if let Some((fd, backend)) = &self.track {
            c.env(env::TRACK_FD, fd.to_string())
                .env(env::TRACK_BACKEND, backend);
        }
        if let Some(fd) = self.advise {
            c.env(env::ADVISE_FD, fd.to_string());
        }
        if let Some(f) = &self.farmem {
            c.env(env::FARMEM_INSTANCE, &f.instance)
                .env(env::FARMEM_TAG, f.tag.to_string())
                .env(env::FARMEM_POLICY, &f.policy)
                .env(env::FARMEM_POLICY_ARGS, &f.policy_args)
                .env(env::FARMEM_STACKS, if f.stacks { "1" } else { "0" })
                .env(env::FARMEM_FAULT_PATH, &f.fault_path);
            if let Some(t) = &f.trace {
                c.env(env::FARMEM_TRACE, t);
            }
            if f.check > 0 {
                c.env(env::FARMEM_CHECK, f.check.to_string());
            }
        }
        if let Some(p) = self.prezero {
            c.env(env::PREZERO, p.spec(None));
        }
    }

    /// What this process was asked, read from its environment (in the
    /// shim, at start-up). The variables its children must not inherit
    /// are removed. `Ok(None)`: nothing was asked. An error (one line)
    /// when the request comes from a pagewise of another contract: nothing
    /// of it is to be done.
    pub fn from_env() -> std::result::Result<Option<ShimRequest>, String> {
        // This process as a request's owner names it: read once, when a
        // pre-zeroing request is there to check or to write back.
        let me = std::cell::OnceCell::new();
        let me = || me.get_or_init(this_process).as_str();
        let var = |k: &str| std::env::var(k).ok();
        let number = |k: &str| var(k).and_then(|v| v.parse::<i64>().ok());
        let fd = |k: &str| {
            number(k)
                .and_then(|v| i32::try_from(v).ok())
                .filter(|&f| f >= 0)
        };
        let req = ShimRequest {
            track: fd(env::TRACK_FD).map(|f| {
                let backend = var(env::TRACK_BACKEND).unwrap_or_else(|| "uffd-wp".into());
                (f, backend)
            }),
            advise: fd(env::ADVISE_FD),
            farmem: var(env::FARMEM_INSTANCE).map(|instance| FarmemRequest {
                instance,
                tag: number(env::FARMEM_TAG)
                    .and_then(|t| u32::try_from(t).ok())
                    .unwrap_or(0),
                policy: var(env::FARMEM_POLICY).unwrap_or_else(|| "fifo".into()),
                policy_args: var(env::FARMEM_POLICY_ARGS).unwrap_or_default(),
                stacks: var(env::FARMEM_STACKS).as_deref() == Some("1"),
                fault_path: var(env::FARMEM_FAULT_PATH).unwrap_or_default(),
                trace: var(env::FARMEM_TRACE).map(PathBuf::from),
                check: number(env::FARMEM_CHECK)
                    .and_then(|c| u64::try_from(c).ok())
                    .unwrap_or(0),
            }),
            prezero: var(env::PREZERO).and_then(|spec| {
                let mut it = spec.split(',');
                let req = PrezeroRequest {
                    ahead: it.next().and_then(|a| a.trim().parse().ok()),
                    rate: it.next().and_then(|r| r.trim().parse().ok()),
                    report: it
                        .next()
                        .and_then(|f| f.trim().parse().ok())
                        .filter(|&f: &i32| f >= 0),
                };
                // Written back by the shim of the process it was for: kept
                // after that process's exec, not taken by its children.
                match it.next().map(str::trim).filter(|o| !o.is_empty()) {
                    Some(owner) if owner != me() => None,
                    _ => Some(req),
                }
            }),
        };
        for k in NOT_INHERITED {
            std::env::remove_var(k);
        }
        if req == ShimRequest::default() {
            return Ok(None);
        }
        let said = var(env::CONTRACT).unwrap_or_default();
        let theirs = said
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u32>().ok());
        if theirs != Some(CONTRACT) {
            return Err(format!(
                "started by a pagewise of contract {} ({}), this shim speaks contract {CONTRACT} \
                 (pagewise {BUILD}): nothing asked of it is done; use the shim that came with \
                 that pagewise",
                theirs.map_or("unknown".into(), |t| t.to_string()),
                said.split_whitespace()
                    .nth(1)
                    .unwrap_or("an older pagewise")
            ));
        }
        if let Some(p) = req.prezero {
            let again = PrezeroRequest { report: None, ..p };
            std::env::set_var(env::PREZERO, again.spec(Some(me())));
        }
        Ok(Some(req))
    }
}

/// Where far-memory instance files live when pagewise's environment says
/// ([`env::FARMEM_DIR`]).
pub fn farmem_dir() -> Option<PathBuf> {
    std::env::var_os(env::FARMEM_DIR).map(PathBuf::from)
}

/// The first bytes of the shim's hello on one of its sockets: the socket's
/// `magic` and the contract, little-endian.
pub fn hello_header(magic: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&magic.to_le_bytes());
    b[4..].copy_from_slice(&CONTRACT.to_le_bytes());
    b
}

/// Reads and checks the first bytes of a shim's hello (`want`: the
/// socket's magic): another magic is not a pagewise shim, another contract
/// a shim of another pagewise, each said in one line.
pub fn check_hello(r: &mut impl Read, want: u32) -> io::Result<()> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    let magic = u32::from_le_bytes(b[..4].try_into().expect("4 bytes"));
    let contract = u32::from_le_bytes(b[4..].try_into().expect("4 bytes"));
    if magic != want {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the shim's hello has magic {magic:#x}, want {want:#x}: not a pagewise shim"),
        ));
    }
    if contract != CONTRACT {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the preload shim speaks contract {contract}, this pagewise contract {CONTRACT} \
                 (pagewise {BUILD}): use the shim built with this pagewise (beside it, or \
                 {})",
                env::PRELOAD
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_of_another_contract_is_refused_in_one_line() {
        let mut ok = &hello_header(0x1234)[..];
        check_hello(&mut ok, 0x1234).unwrap();
        let mut other = [0u8; 8];
        other[..4].copy_from_slice(&0x1234u32.to_le_bytes());
        other[4..].copy_from_slice(&(CONTRACT + 1).to_le_bytes());
        let e = check_hello(&mut &other[..], 0x1234)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&format!("speaks contract {}", CONTRACT + 1)),
            "{e}"
        );
        assert!(
            e.contains(&format!("this pagewise contract {CONTRACT}")),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
        let e = check_hello(&mut &hello_header(0x99)[..], 0x1234).unwrap_err();
        assert!(e.to_string().contains("not a pagewise shim"), "{e}");
    }

    #[test]
    fn a_request_goes_through_the_environment_unchanged() {
        let asked = ShimRequest {
            track: Some((7, "uffd-wp".into())),
            advise: Some(9),
            farmem: Some(FarmemRequest {
                instance: "inst".into(),
                tag: 42,
                policy: "lru".into(),
                policy_args: "a b".into(),
                stacks: true,
                fault_path: "inline".into(),
                trace: Some("/tmp/t".into()),
                check: 64,
            }),
            prezero: Some(PrezeroRequest {
                ahead: Some(3),
                rate: Some(1.5),
                report: Some(11),
            }),
        };
        let mut c = Command::new("true");
        asked.apply(&mut c);
        // What the shim would read: the command's environment, here.
        let vars: Vec<(String, String)> = c
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
            .collect();
        let got = with_env(&vars, ShimRequest::from_env).unwrap().unwrap();
        assert_eq!(got, asked);
        // Another contract: refused, in one line.
        let mut other = vars.clone();
        other.retain(|(k, _)| k != env::CONTRACT);
        other.push((env::CONTRACT.into(), "999 9.9.9".into()));
        let e = with_env(&other, ShimRequest::from_env).unwrap_err();
        assert!(e.contains("contract 999 (9.9.9)"), "{e}");
        assert_eq!(e.lines().count(), 1);
        // Nothing asked: nothing to refuse.
        assert_eq!(with_env(&[], ShimRequest::from_env), Ok(None));
    }

    /// Runs `f` with exactly the pagewise variables `vars` set, then
    /// removes them (this test alone sets them in this process).
    fn with_env<T>(vars: &[(String, String)], f: impl FnOnce() -> T) -> T {
        static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let all = [
            env::CONTRACT,
            env::TRACK_FD,
            env::TRACK_BACKEND,
            env::ADVISE_FD,
            env::FARMEM_INSTANCE,
            env::FARMEM_TAG,
            env::FARMEM_POLICY,
            env::FARMEM_POLICY_ARGS,
            env::FARMEM_STACKS,
            env::FARMEM_FAULT_PATH,
            env::FARMEM_TRACE,
            env::FARMEM_CHECK,
            env::PREZERO,
        ];
        for k in all {
            std::env::remove_var(k);
        }
        for (k, v) in vars {
            std::env::set_var(k, v);
        }
        let r = f();
        for k in all {
            std::env::remove_var(k);
        }
        r
    }
}
