//! The contract between pagewise and its preload shim, and the shim from
//! pagewise's side: where its file is and starting a program with it.
//!
//! Everything the two must agree on is versioned by one number,
//! [`CONTRACT`]:
//!
//! - **the environment** ([`env`](mod@env)): what pagewise asks of the shim. It
//!   is written in one place ([`ask`]) and read in one place ([`asked`],
//!   after [`contract_of_request`] checked [`env::CONTRACT`]); each part of
//!   a request is a typed [`Request`] owned by what it is for;
//! - **the hellos** the shim sends first on its sockets: the tracking
//!   socket (`track::protocol`, magic `PGWS`) and the advice socket
//!   ([`crate::inject::shim`], magic `PGWA`) both begin with their magic and
//!   the contract ([`hello_header`], checked by [`check_hello`]), as do
//!   the requests of far memory's members in containers to the host's
//!   server ([`crate::inject::uffd_lending`], magic `PGWU`);
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
/// program's `exec` (the request's owner); 6: far memory's userfaultfds
/// made by the host's server (`inject::uffd_lending`, magic `PGWU`); 7:
/// resets made inside the program ([`env::RESET`]).
pub const CONTRACT: u32 = 7;

/// The package version of this build, said beside the contract.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// The environment between pagewise and the preload shim. Who sets each
/// variable, who reads it, and its format.
pub mod env {
    /// Set with every request ([`ask`](super::ask)),
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
    /// Read by the library in every process: the directory of the sockets
    /// of far-memory servers (`pagewise farmem serve`; default
    /// `/run/pagewise/farmem`), which only root may create entries in.
    pub const FARMEM_SOCKETS: &str = "PAGEWISE_FARMEM_SOCKETS";
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
    /// Set by `pagewise::snap::process::afl::serve` (`pagewise snapshot
    /// afl`), read and removed by the shim at start-up: resets made inside
    /// the program (`pagewise::snap::process::inside`), as
    /// `INPUT,CONTROL,STATUS,BOARD,READ`: the descriptor the program reads
    /// its input from, AFL++'s control and status pipes and the shared
    /// board (decimal numbers of descriptors passed to the shim), and `1`
    /// when the control word of the next run was read already (by the
    /// program before this one), else `0`.
    pub const RESET: &str = "PAGEWISE_RESET";
}

/// The name of the preload shim's file.
pub const SHIM_FILE: &str = "libpagewise_preload.so";

/// The preload shim: [`env::PRELOAD`] if set, else the first of
/// `libpagewise_preload.so` beside the running executable, in its parent
/// directory, in `../lib/pagewise` (where `make install` and the Debian
/// package put it: `PREFIX/bin` and `PREFIX/lib/pagewise`), in `../lib`,
/// and in the release directory of the source tree this library was built
/// from (for `cargo install --path crates/faces/cli`, which installs no shim).
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
            .join("../../../target/release")
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
    let program = cmd.first().ok_or(Error::NoCommand)?;
    let mut c = Command::new(program);
    c.args(&cmd[1..]).env("LD_PRELOAD", ld_preload()?);
    crate::child::tie(&mut c);
    Ok(c)
}

/// `cmd` under the shim, started, with the shim's end of a new socketpair
/// passed to it in the request `ask` sets (see [`ask`](fn@ask)) with its fd number, and the
/// command set up further by `setup` (its standard streams, say); returns
/// the child and pagewise's end.
pub fn spawn_with_socket(
    cmd: &[String],
    ask: impl FnOnce(&mut Command, i32),
    setup: impl FnOnce(&mut Command),
) -> Result<(Child, UnixStream)> {
    let program = cmd.first().ok_or(Error::NoCommand)?;
    let (mine, theirs) =
        UnixStream::pair().map_err(|e| Error::os("creating the shim's socket", e))?;
    let fd = theirs.as_raw_fd();
    let mut c = shim_command(cmd)?;
    ask(&mut c, fd);
    setup(&mut c);
    pagewise_sys::process::keep_fd_across_exec(&mut c, fd);
    let child = c
        .spawn()
        .map_err(|e| Error::os(format!("starting {program}"), e))?;
    drop(theirs);
    Ok((child, mine))
}

/// One part of what pagewise asks of the shim in one program: a typed
/// request owned by the capability or mechanism it is for (tracking, the
/// advice socket, far memory, pre-zeroing), carried by variables of
/// [`env`](mod@env). It is written in one place ([`ask`]) and read in one
/// place ([`asked`]); a value the shim cannot read is refused with the
/// variable's name ([`parsed`]), never taken for a default.
pub trait Request: Sized {
    /// The variable whose presence says this part is asked.
    const KEY: &'static str;
    /// Every variable of the part.
    const VARS: &'static [&'static str];
    /// Whether the program's children (other processes) may take the
    /// request too; if not, the shim removes its variables at start-up.
    const INHERITED: bool;
    /// Sets each variable of the request (by `set(name, value)`).
    fn encode(&self, set: &mut dyn FnMut(&'static str, String));
    /// The request, from the variables `get` reads; `Ok(None)`: the
    /// variables are there, but not for this process. An error (one line)
    /// names the variable and what it holds.
    fn decode(
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> std::result::Result<Option<Self>, String>;
}

/// The variables whose presence asks something of the shim: one per
/// [`Request`] (the contract is checked whenever one is set).
pub const REQUEST_KEYS: [&str; 5] = [
    env::TRACK_FD,
    env::ADVISE_FD,
    env::FARMEM_INSTANCE,
    env::PREZERO,
    env::RESET,
];

/// Sets the environment of `c` that asks for `r`, with the contract.
pub fn ask(c: &mut Command, r: &impl Request) {
    c.env(env::CONTRACT, format!("{CONTRACT} {BUILD}"));
    r.encode(&mut |k, v| {
        c.env(k, v);
    });
}

/// Whether pagewise asked anything of this process (in the shim, at
/// start-up, before any [`asked`]). An error (one line) when the request
/// comes from a pagewise of another contract: nothing of it is to be done.
pub fn contract_of_request() -> std::result::Result<bool, String> {
    if !REQUEST_KEYS.iter().any(|k| std::env::var_os(k).is_some()) {
        return Ok(false);
    }
    let said = std::env::var(env::CONTRACT).unwrap_or_default();
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
    Ok(true)
}

/// The request of type `R` made of this process, read from its
/// environment (in the shim, at start-up, after
/// [`contract_of_request`]); its variables are removed when its children
/// must not inherit it. `Ok(None)`: not asked.
pub fn asked<R: Request>() -> std::result::Result<Option<R>, String> {
    if std::env::var_os(R::KEY).is_none() {
        return Ok(None);
    }
    let got = R::decode(&|k| std::env::var(k).ok());
    if !R::INHERITED {
        for k in R::VARS {
            std::env::remove_var(k);
        }
    }
    got
}

/// The value of variable `var` as a `T`: `Ok(None)` when unset or empty,
/// an error naming the variable when it does not parse.
pub fn parsed<T: std::str::FromStr>(
    get: &dyn Fn(&'static str) -> Option<String>,
    var: &'static str,
) -> std::result::Result<Option<T>, String> {
    match get(var) {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => v.trim().parse().map(Some).map_err(|_| {
            format!(
                "{var}={v:?} is not a {}: nothing of this request is done",
                std::any::type_name::<T>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("value")
            )
        }),
    }
}

/// `r` encoded and decoded again, through a map rather than the
/// environment (for the capabilities' tests of their requests).
#[doc(hidden)]
pub fn round_trip<R: Request>(r: &R) -> std::result::Result<Option<R>, String> {
    let mut vars = std::collections::HashMap::new();
    r.encode(&mut |k, v| {
        vars.insert(k, v);
    });
    R::decode(&|k| vars.get(k).cloned())
}

/// A descriptor number in variable `var` ([`parsed`], not negative).
pub fn parsed_fd(
    get: &dyn Fn(&'static str) -> Option<String>,
    var: &'static str,
) -> std::result::Result<Option<i32>, String> {
    match parsed::<i32>(get, var)? {
        Some(f) if f < 0 => Err(format!(
            "{var}={f} is not a descriptor: nothing of this request is done"
        )),
        f => Ok(f),
    }
}

/// Where far-memory instance files live when pagewise's environment says
/// ([`env::FARMEM_DIR`]).
pub fn farmem_dir() -> Option<PathBuf> {
    std::env::var_os(env::FARMEM_DIR).map(PathBuf::from)
}

/// Where the sockets of far-memory servers are when pagewise's
/// environment says ([`env::FARMEM_SOCKETS`]).
pub fn farmem_sockets() -> Option<PathBuf> {
    std::env::var_os(env::FARMEM_SOCKETS).map(PathBuf::from)
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

    /// A request of two variables, for the tests.
    #[derive(Debug, PartialEq)]
    struct Asked {
        fd: i32,
        rate: Option<f64>,
    }

    impl Request for Asked {
        const KEY: &'static str = env::ADVISE_FD;
        const VARS: &'static [&'static str] = &[env::ADVISE_FD, env::PREZERO];
        const INHERITED: bool = false;
        fn encode(&self, set: &mut dyn FnMut(&'static str, String)) {
            set(env::ADVISE_FD, self.fd.to_string());
            if let Some(r) = self.rate {
                set(env::PREZERO, r.to_string());
            }
        }
        fn decode(
            get: &dyn Fn(&'static str) -> Option<String>,
        ) -> std::result::Result<Option<Self>, String> {
            Ok(parsed_fd(get, env::ADVISE_FD)?.map(|fd| Asked {
                fd,
                rate: parsed(get, env::PREZERO).ok().flatten(),
            }))
        }
    }

    #[test]
    fn a_request_goes_through_the_environment_unchanged() {
        let request = Asked {
            fd: 9,
            rate: Some(1.5),
        };
        let mut c = Command::new("true");
        ask(&mut c, &request);
        // What the shim would read: the command's environment, here.
        let vars: Vec<(String, String)> = c
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v?.to_str()?.to_string())))
            .collect();
        let got = with_env(&vars, || {
            let asked = contract_of_request().map(|any| any.then(asked::<Asked>));
            // Taken once: its children do not inherit it.
            (asked, std::env::var_os(env::ADVISE_FD))
        });
        assert_eq!(
            got.0,
            Ok(Some(Ok(Some(Asked {
                fd: 9,
                rate: Some(1.5)
            }))))
        );
        assert_eq!(got.1, None, "the variable is removed once read");
        // Another contract: refused, in one line.
        let mut other = vars.clone();
        other.retain(|(k, _)| k != env::CONTRACT);
        other.push((env::CONTRACT.into(), "999 9.9.9".into()));
        let e = with_env(&other, contract_of_request).unwrap_err();
        assert!(e.contains("contract 999 (9.9.9)"), "{e}");
        assert_eq!(e.lines().count(), 1);
        // Nothing asked: nothing to refuse.
        assert_eq!(with_env(&[], contract_of_request), Ok(false));
        assert_eq!(with_env(&[], asked::<Asked>), Ok(None));
    }

    #[test]
    fn a_value_the_shim_cannot_read_is_refused_with_its_variable() {
        let vars = |fd: &str| vec![(env::ADVISE_FD.to_string(), fd.to_string())];
        let e = with_env(&vars("seven"), asked::<Asked>).unwrap_err();
        assert!(
            e.starts_with("PAGEWISE_ADVISE_FD=\"seven\" is not a i32"),
            "{e}"
        );
        let e = with_env(&vars("-3"), asked::<Asked>).unwrap_err();
        assert!(
            e.contains("PAGEWISE_ADVISE_FD=-3 is not a descriptor"),
            "{e}"
        );
        assert_eq!(with_env(&vars(""), asked::<Asked>), Ok(None));
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
