//! The library's error type: each message says what was being done and with
//! which value.

use crate::PAGE_SIZE;

mod kinds;
pub use kinds::Refusal;

/// Errors of the pagewise library. Each message says what was being done and with which value.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A range that is not page-aligned or is empty.
    #[error(
        "range {start:#x}+{len:#x} is not page-aligned and non-empty (page size {})",
        PAGE_SIZE
    )]
    Unaligned {
        /// Start address.
        start: u64,
        /// Length in bytes.
        len: u64,
    },
    /// The kernel lacks a feature the request needs.
    #[error("{feature} is not available: {why}")]
    Unsupported {
        /// The feature.
        feature: &'static str,
        /// Why, as the probe found it.
        why: String,
    },
    /// No process with this pid.
    #[error("no process with pid {0}")]
    NoSuchProcess(i32),
    /// The caller may not inspect or control the process.
    #[error("permission denied on pid {pid}: {what} ({})", permission_advice())]
    PermissionDenied {
        /// The process.
        pid: i32,
        /// What was refused.
        what: String,
    },
    /// The process exited while it was being worked on.
    #[error("process {0} exited")]
    ProcessExited(i32),
    /// The process replaced its program (`exec`) while pagewise held it
    /// (tracked its memory, held its snapshots): what it held is gone.
    #[error("process {0} replaced its program (exec): what pagewise held of it (tracked memory, snapshots) is of the old program; start again with the new one")]
    ProgramReplaced(i32),
    /// A system call failed.
    #[error("{what}: {source}")]
    Os {
        /// What was being done.
        what: String,
        /// The kernel's answer.
        #[source]
        source: std::io::Error,
    },
    /// A stored file is damaged or not what it claims to be.
    #[error("{path} is corrupt: {what}")]
    Corrupt {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// Bad argument.
    #[error("{0}")]
    Invalid(String),
    /// The thing asked for does not exist (an instance, a snapshot, a consumer).
    #[error("{0}")]
    NotFound(String),
    /// It exists already.
    #[error("{0}")]
    Exists(String),
    /// The caller may not do this to an object pagewise keeps (another
    /// user's instance, an unsafe directory, a read-only handle).
    #[error("{0}")]
    NotPermitted(String),
    /// Another process holds it (a store being written).
    #[error("{0}")]
    Busy(String),
    /// A fixed limit was reached (regions per process, members, snapshot ids).
    #[error("{0}")]
    Limit(String),
    /// Nothing is mapped where the request says, or not as it needs.
    #[error("{0}")]
    NotMapped(String),
    /// Memory of a type this capability does not handle (shared, file-backed,
    /// hugetlb); the message says which types it does.
    #[error("{0}")]
    MemoryType(String),
    /// The engine's handler thread is gone (it died, or was stopped).
    #[error("{0}")]
    EngineStopped(String),
    /// Waiting for another party ran out of time.
    #[error("{0}")]
    Timeout(String),
    /// A process could not be stopped or acted inside (see the kinds).
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// pagewise's own bookkeeping is inconsistent: a bug, reported rather
    /// than turned into wrong data.
    #[error("internal error: {0}")]
    Internal(String),
    /// The preload shim is not where pagewise looks for it.
    #[error("libpagewise_preload.so not found beside {} (build it with `cargo build --release`, or set PAGEWISE_PRELOAD)", beside.display())]
    ShimNotFound {
        /// The executable beside which it was looked for.
        beside: std::path::PathBuf,
    },
    /// A program started under the shim did not answer the handshake.
    #[error("the preload shim in {program} did not answer ({source}): a statically linked or setuid program ignores LD_PRELOAD, and a wrapper that replaces itself with exec leaves it behind")]
    ShimSilent {
        /// The program.
        program: String,
        /// What the handshake met.
        #[source]
        source: std::io::Error,
    },
}

/// What kind of failure an error is: what a caller (a script, the command
/// line's exit status) needs to tell "not available here" from "failed".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorClass {
    /// The request itself is wrong (a bad argument, an unaligned range).
    BadInput,
    /// This kernel or machine lacks what it needs (a feature, a memory
    /// type, the shim).
    Unsupported,
    /// Not allowed (on a process, a store, a setting).
    Permission,
    /// The process it was about went away (or replaced its program).
    Gone,
    /// Held or in a passing state now: another tracer or pagewise agent
    /// holds it, a store is locked by its writer, a `vfork` is in progress,
    /// a thread would not stop. The same request may succeed later.
    Busy,
    /// Anything else: it was tried and failed.
    Failed,
}

/// What every error of pagewise says besides its text: its class and the
/// errno that says it best to C callers and over the wire. The mechanisms'
/// [`Error`] and each capability's own error implement it, so that a face
/// (the command line's exit status, the C API's errno, Python's exception)
/// treats them alike.
pub trait Failure: std::error::Error + Send + Sync + 'static {
    /// Its class (see [`ErrorClass`]).
    fn class(&self) -> ErrorClass;
    /// Its errno.
    fn errno(&self) -> i32;
}

impl Failure for Error {
    fn class(&self) -> ErrorClass {
        Error::class(self)
    }
    fn errno(&self) -> i32 {
        Error::errno(self)
    }
}

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What to do about a refused `ptrace`: Yama's scope is named only where
/// Yama is there.
fn permission_advice() -> &'static str {
    if std::path::Path::new("/proc/sys/kernel/yama/ptrace_scope").exists() {
        "run as the process's owner or root, or relax kernel.yama.ptrace_scope"
    } else {
        "run as the process's owner or root"
    }
}

impl Error {
    /// Wraps an OS error with what was being done.
    pub fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Os {
            what: what.into(),
            source,
        }
    }

    /// Like [`Error::for_pid`] for another process (`Some(pid)`), and
    /// [`Error::os`] for the calling process (`None`).
    pub fn at(pid: Option<i32>, what: impl Into<String>, source: std::io::Error) -> Self {
        match pid {
            Some(p) => Error::for_pid(p, what, source),
            None => Error::os(what, source),
        }
    }

    /// The errno that says this error best to C callers and over the wire.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Unaligned { .. } | Error::Invalid(_) => libc::EINVAL,
            Error::Unsupported { .. } => libc::EOPNOTSUPP,
            Error::NoSuchProcess(_) | Error::ProcessExited(_) | Error::ProgramReplaced(_) => {
                libc::ESRCH
            }
            Error::PermissionDenied { .. } => libc::EPERM,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EBADMSG,
            Error::ShimNotFound { .. } => libc::ENOENT,
            Error::ShimSilent { source, .. } => source.raw_os_error().unwrap_or(libc::EPROTO),
            Error::Exists(_) => libc::EEXIST,
            Error::NotFound(_) => libc::ENOENT,
            Error::NotPermitted(_) => libc::EACCES,
            Error::Busy(_) => libc::EBUSY,
            Error::Limit(_) => libc::ENOSPC,
            Error::NotMapped(_) => libc::EFAULT,
            Error::MemoryType(_) => libc::EINVAL,
            Error::EngineStopped(_) => libc::EPIPE,
            Error::Timeout(_) => libc::ETIMEDOUT,
            Error::Refused(r) if r.is_permanent() => libc::EOPNOTSUPP,
            Error::Refused(_) => libc::EBUSY,
            Error::Internal(_) => libc::ENOTRECOVERABLE,
        }
    }

    /// Its class (see [`ErrorClass`]).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Unaligned { .. } | Error::Invalid(_) => ErrorClass::BadInput,
            Error::Unsupported { .. } | Error::MemoryType(_) | Error::ShimNotFound { .. } => {
                ErrorClass::Unsupported
            }
            Error::Refused(r) if r.is_permanent() => ErrorClass::Unsupported,
            Error::Refused(r) if r.is_passing() => ErrorClass::Busy,
            Error::Busy(_) => ErrorClass::Busy,
            Error::PermissionDenied { .. } | Error::NotPermitted(_) => ErrorClass::Permission,
            Error::NoSuchProcess(_) | Error::ProcessExited(_) | Error::ProgramReplaced(_) => {
                ErrorClass::Gone
            }
            Error::Os { source, .. } => match source.raw_os_error() {
                Some(libc::EPERM | libc::EACCES) => ErrorClass::Permission,
                Some(libc::ENOSYS | libc::EOPNOTSUPP) => ErrorClass::Unsupported,
                _ => ErrorClass::Failed,
            },
            _ => ErrorClass::Failed,
        }
    }

    /// Maps an OS error met while working on process `pid` to the clearest error.
    pub fn for_pid(pid: i32, what: impl Into<String>, source: std::io::Error) -> Self {
        match source.raw_os_error() {
            Some(libc::ESRCH) | Some(libc::ENOENT) => {
                if !crate::procfs::is_alive(pid) {
                    Error::ProcessExited(pid)
                } else {
                    Error::os(what, source)
                }
            }
            Some(libc::EPERM) | Some(libc::EACCES) => Error::PermissionDenied {
                pid,
                what: what.into(),
            },
            _ => Error::os(what, source),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_errors_say_their_class_and_errno() {
        let cases: Vec<(Error, ErrorClass, i32)> = vec![
            (
                Refusal::Seccomp {
                    feature: "uffd-wp",
                    pid: 7,
                    call: "userfaultfd".into(),
                }
                .into(),
                ErrorClass::Unsupported,
                libc::EOPNOTSUPP,
            ),
            (
                Refusal::InVfork { pid: 7, tid: 8 }.into(),
                ErrorClass::Busy,
                libc::EBUSY,
            ),
            (Error::Busy("ksm/run".into()), ErrorClass::Busy, libc::EBUSY),
        ];
        for (e, class, errno) in cases {
            assert_eq!(e.class(), class, "{e}");
            assert_eq!(e.errno(), errno, "{e}");
            assert_eq!(e.to_string().lines().count(), 1, "{e}");
        }
    }
}
