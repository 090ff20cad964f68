//! A program started for a reset session ([`start_before_read`]): run
//! from its first instruction up to its first read of its input, and
//! parked there, about to read, for a session to take its point.
//!
//! The child stops itself before `execve`; it is seized there and
//! followed call by call (`PTRACE_SYSCALL`, the kernel's account of each
//! call from `PTRACE_GET_SYSCALL_INFO`) until it enters `read` on the
//! input descriptor. That call is turned into `pause` (its number
//! changed at entry, its arguments left in their registers) and the
//! program let go: it sleeps, untraced, with nothing read, until a
//! session stops it, records its point, and writes `read`'s number back
//! into the recorded registers ([`Launched::read_nr`]); every reset then
//! makes the program read its input afresh.
//!
//! The program runs under a seccomp filter that answers `exit_group`
//! with `SECCOMP_RET_TRACE` ([`pagewise_sys::launch::exit_group_filter`]):
//! the end of a run stops it whole for the holder ([`super::Held::wait_end`])
//! instead of ending it. Descriptors listed in `close` are not passed on
//! (a fuzzer's control pipes, which the program would otherwise take for
//! its own fork server's).

use crate::{Error, Result};
use pagewise_sys::launch::{self as l, SyscallStop};
use pagewise_sys::process::{self as p, TraceStop};
use std::ffi::{CString, OsStr};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::time::{Duration, Instant};

/// A program parked before its first read of its input (see the module).
#[derive(Debug, Clone, Copy)]
pub struct Launched {
    /// The process.
    pub pid: i32,
    /// The call to put back in the point's registers: `read`.
    pub read_nr: i64,
}

/// `PTRACE_O_EXITKILL`: the tracee dies with its tracer.
const EXITKILL: libc::c_int = 0x0010_0000;

/// Calls followed at most before the input is read (a loader and a C
/// library's start take a few hundred).
const MAX_CALLS: u32 = 1_000_000;

/// The program `argv[0]` names, found as a shell would (`PATH` when it
/// holds no `/`).
fn resolve(program: &OsStr) -> Result<std::path::PathBuf> {
    let name = std::path::Path::new(program);
    if program.as_bytes().contains(&b'/') {
        return Ok(name.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|c| {
            use std::os::unix::fs::PermissionsExt;
            c.metadata()
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
        .ok_or_else(|| {
            Error::os(
                format!("finding {} on PATH", name.display()),
                std::io::Error::from_raw_os_error(libc::ENOENT),
            )
        })
}

fn cstring(s: &OsStr) -> Result<CString> {
    CString::new(s.as_bytes()).map_err(|_| Error::BadPath {
        path: s.as_bytes().to_vec(),
    })
}

/// Starts `argv` and parks it before its first `read` of descriptor `fd`
/// (see the module), waiting at most `limit` for it to get there. The
/// program ending first, or not reading by then, is an error saying so
/// (the program killed).
pub fn start_before_read(
    argv: &[std::ffi::OsString],
    fd: RawFd,
    close: &[RawFd],
    limit: Duration,
) -> Result<Launched> {
    let first = argv.first().ok_or(Error::NoCommand)?;
    let path = cstring(resolve(first)?.as_os_str())?;
    let args = argv
        .iter()
        .map(|a| cstring(a))
        .collect::<Result<Vec<_>>>()?;
    let filter = l::exit_group_filter();
    let pid = l::spawn_stopped(&path, &args, close, Some(&filter))
        .map_err(|e| Error::os(format!("starting {}", first.to_string_lossy()), e))?;
    let r = follow_to_read(pid, fd, limit);
    if r.is_err() {
        let _ = p::kill(pid, libc::SIGKILL);
        let _ = l::wait_raw(pid, libc::__WALL);
    }
    r.map_err(|e| match e {
        Error::Os { what, source } => Error::Os {
            what: format!("{} (process {pid}): {what}", first.to_string_lossy()),
            source,
        },
        e => e,
    })?;
    Ok(Launched {
        pid,
        read_nr: libc::SYS_read,
    })
}

/// The error of a program that did not get to its read.
fn never_read(why: String) -> Error {
    Error::os(why, std::io::Error::from_raw_os_error(libc::ECHILD))
}

fn follow_to_read(pid: i32, fd: RawFd, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    let os = |what: &str, e| Error::os(what.to_string(), e);
    // Stopped before execve (a group-stop), then seized.
    let (_, st) = l::wait_raw(pid, libc::WUNTRACED).map_err(|e| os("waiting for its stop", e))?;
    if !libc::WIFSTOPPED(st) {
        return Err(never_read(format!(
            "it ended before execve (status {st:#x})"
        )));
    }
    l::ptrace_seize_with(
        pid,
        libc::PTRACE_O_TRACESYSGOOD | libc::PTRACE_O_TRACESECCOMP | EXITKILL,
    )
    .map_err(|e| os("PTRACE_SEIZE", e))?;
    p::kill(pid, libc::SIGCONT).map_err(|e| os("SIGCONT", e))?;
    let mut exec_seen = false;
    for _ in 0..MAX_CALLS {
        let stop = p::wait_traced_until(pid, deadline).map_err(|e| os("waiting", e))?;
        let (sig, event) = match stop {
            None => {
                return Err(never_read(format!(
                    "it did not read descriptor {fd} within {} s",
                    limit.as_secs_f64()
                )))
            }
            Some(TraceStop::Gone) => {
                return Err(never_read(format!(
                    "it ended before reading descriptor {fd}"
                )))
            }
            Some(TraceStop::Stopped { sig, event }) => (sig, event),
        };
        let mut deliver = 0;
        if sig == p::SYSCALL_STOP {
            let info = l::ptrace_syscall_info(pid).map_err(|e| os("PTRACE_GET_SYSCALL_INFO", e))?;
            match info {
                SyscallStop::Entry { nr, .. } if nr == libc::SYS_execve => exec_seen = true,
                SyscallStop::Entry { nr, args }
                    if exec_seen && nr == libc::SYS_read && args[0] == fd as u64 =>
                {
                    return park(pid);
                }
                _ => {}
            }
        } else if event == l::PTRACE_EVENT_SECCOMP {
            let code = match l::ptrace_syscall_info(pid) {
                Ok(SyscallStop::Seccomp { args, .. }) => args[0] as i32,
                _ => -1,
            };
            return Err(never_read(format!(
                "it ended (exit code {code}) before reading descriptor {fd}"
            )));
        } else if event == 0 {
            // A signal on its way: delivered as it came.
            deliver = sig;
        }
        l::ptrace_syscall_signal(pid, deliver).map_err(|e| os("PTRACE_SYSCALL", e))?;
    }
    Err(never_read(format!(
        "it made {MAX_CALLS} calls without reading descriptor {fd}"
    )))
}

/// At the entry of its `read`: the call becomes `pause`, and the program
/// is let go.
fn park(pid: i32) -> Result<()> {
    let mut regs = p::ptrace_getregs(pid).map_err(|e| Error::for_pid(pid, "PTRACE_GETREGS", e))?;
    regs.orig_rax = libc::SYS_pause as u64;
    p::ptrace_setregs(pid, &regs).map_err(|e| Error::for_pid(pid, "PTRACE_SETREGS", e))?;
    l::ptrace_detach_running(pid).map_err(|e| Error::for_pid(pid, "PTRACE_DETACH", e))?;
    // Asleep in pause before anyone stops it.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if let Ok(Some((nr, _))) = crate::procfs::thread_syscall(pid, pid) {
            if nr == libc::SYS_pause {
                return Ok(());
            }
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Err(never_read("it did not sleep in its parked call".into()))
}
