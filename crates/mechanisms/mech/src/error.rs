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
    /// A range that runs past the top of the address space.
    #[error("range {start:#x}+{len:#x} runs past the top of the address space")]
    RangeOverflow {
        /// Its start.
        start: u64,
        /// Its length.
        len: u64,
    },
    /// Two regions given together overlap.
    #[error("regions {a_start:#x}+{a_len:#x} and {b_start:#x}+{b_len:#x} overlap")]
    Overlap {
        /// The first's start.
        a_start: u64,
        /// The first's length.
        a_len: u64,
        /// The second's start.
        b_start: u64,
        /// The second's length.
        b_len: u64,
    },
    /// A measurement of nothing (no memory, no accesses).
    #[error("a measurement needs memory and accesses")]
    NothingToMeasure,
    /// No command was given to start.
    #[error("no command to start")]
    NoCommand,
    /// The process is pagewise itself.
    #[error("process {pid} is pagewise itself: its memory is not written from outside")]
    SelfTarget {
        /// The process.
        pid: i32,
    },
    /// A kernel thread, which has no user memory.
    #[error("process {pid} ({comm}) is a kernel thread: it has no user memory")]
    KernelThread {
        /// The process.
        pid: i32,
        /// Its command name.
        comm: String,
    },
    /// A thread that is not one of those stopped in the process.
    #[error("thread {tid} is not a stopped thread of process {pid}")]
    NotStopped {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A path with no file name.
    #[error("{} names no file", path.display())]
    NoFileName {
        /// The path.
        path: std::path::PathBuf,
    },
    /// A path that cannot be passed into a process (longer than a page, or
    /// with a NUL).
    #[error(
        "a path longer than a page, or with a NUL: {}",
        String::from_utf8_lossy(path)
    )]
    BadPath {
        /// The path.
        path: Vec<u8>,
    },
    /// A file the kernel writes lacks what pagewise reads in it.
    #[error("{file} has no {field}")]
    MissingField {
        /// The file.
        file: String,
        /// What it lacks.
        field: &'static str,
    },
    /// A setting held by another owner (one owner per system setting).
    #[error("{}", held_text(setting, holder))]
    SettingHeld {
        /// The setting's file.
        setting: std::path::PathBuf,
        /// Who holds it.
        holder: Holder,
    },
    /// Changing a system setting needs root (its old value is journaled
    /// first, where only root may write).
    #[error(
        "changing a system setting ({setting}) needs root: its old value is journaled in {} \
         first, which only root may write; run as root",
        journal.display()
    )]
    NeedsRoot {
        /// The setting.
        setting: String,
        /// The journal's directory.
        journal: std::path::PathBuf,
    },
    /// A journal file that is not a regular file of this user.
    #[error("{} is not a regular file of yours: not a pagewise journal", path.display())]
    NotAJournal {
        /// The file.
        path: std::path::PathBuf,
    },
    /// A device in use by someone else.
    #[error("{device} is already {use_}")]
    DeviceBusy {
        /// The device.
        device: &'static str,
        /// What it is used as.
        use_: &'static str,
    },
    /// Part of another process's memory could not be read or written.
    #[error(
        "process {pid}: {addr:#x}+{len:#x} is not mapped ({done} bytes {})",
        if *write { "written" } else { "read" }
    )]
    Unmapped {
        /// The process.
        pid: i32,
        /// The first byte.
        addr: u64,
        /// The bytes asked for.
        len: u64,
        /// The bytes done.
        done: u64,
        /// Whether it was a write.
        write: bool,
    },
    /// A thread whose stack pointer points at no stack.
    #[error("process {pid}: thread {tid} has no stack below {rsp:#x}")]
    NoStack {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// Its stack pointer.
        rsp: u64,
    },
    /// Part of a region is not mapped readable and writable.
    #[error(
        "region {start:#x}+{len:#x}: {}",
        if *mapped {
            format!("the mapping at {at:#x} is not readable and writable")
        } else {
            format!("nothing is mapped at {at:#x}")
        }
    )]
    NotWritable {
        /// The region's start.
        start: u64,
        /// Its length.
        len: u64,
        /// Where.
        at: u64,
        /// Whether something is mapped there.
        mapped: bool,
    },
    /// Memory of a type this capability does not handle (shared,
    /// file-backed, hugetlb).
    #[error(
        "region {start:#x}+{len:#x}: the mapping at {at:#x} is {kind} memory; {capability} works \
         on {} memory",
        works_on.join(" and ")
    )]
    MemoryType {
        /// The region's start.
        start: u64,
        /// Its length.
        len: u64,
        /// The mapping's start.
        at: u64,
        /// Its type.
        kind: &'static str,
        /// The capability (or backend) asked.
        capability: String,
        /// The types it handles.
        works_on: Vec<&'static str>,
    },
    /// A process could not be stopped or acted inside (see the kinds).
    #[error("{0}")]
    Refused(#[from] Refusal),
    /// No running container has this id, id prefix or name.
    #[error("no running container has the id or name {which:?} (ids are read from /proc/PID/cgroup; names are asked of podman and docker)")]
    NoSuchContainer {
        /// What was asked for.
        which: String,
    },
    /// A cgroup path that names no cgroup.
    #[error("{path} is not a cgroup: {why} (give a directory under /sys/fs/cgroup that holds cgroup.procs, or a path as /proc/PID/cgroup shows it)")]
    NotACgroup {
        /// What was asked for.
        path: String,
        /// Why it is none.
        why: String,
    },
    /// An id prefix that starts several running containers' ids.
    #[error("{which:?} is the start of {count} running containers' ids: give more of it")]
    AmbiguousContainer {
        /// What was asked for.
        which: String,
        /// How many ids it starts.
        count: usize,
    },
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

crate::impl_failure!(Error);

/// Implements [`Failure`] for an error type by its inherent `class` and
/// `errno` (each error of the library has both, so that a caller needs no
/// trait in scope).
#[macro_export]
macro_rules! impl_failure {
    ($t:ty) => {
        impl $crate::Failure for $t {
            fn class(&self) -> $crate::ErrorClass {
                <$t>::class(self)
            }
            fn errno(&self) -> i32 {
                <$t>::errno(self)
            }
        }
    };
}

/// Result alias of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Who holds a system setting pagewise wants.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Holder {
    /// This process, for another task (for longer than a claim waits).
    ThisProcess,
    /// Another pagewise process, until it ends.
    Pagewise {
        /// It.
        pid: i32,
        /// Its command name.
        cmd: String,
    },
    /// Another pagewise process whose journal says nothing readable.
    Unknown,
    /// No one for long: it changed hands too often to be claimed.
    Churning,
}

fn held_text(setting: &std::path::Path, holder: &Holder) -> String {
    let s = setting.display();
    match holder {
        Holder::ThisProcess => format!("{s} is held by this process for another task"),
        Holder::Pagewise { pid, cmd } => format!(
            "{s} is held by pagewise process {pid} ({cmd}) until it ends: one owner per system setting"
        ),
        Holder::Unknown => format!(
            "{s} is held by another pagewise process until it ends: one owner per system setting"
        ),
        Holder::Churning => format!("{s} changed hands too often to be claimed; try again"),
    }
}

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
            Error::Unaligned { .. }
            | Error::RangeOverflow { .. }
            | Error::Overlap { .. }
            | Error::NothingToMeasure
            | Error::NoCommand
            | Error::SelfTarget { .. }
            | Error::KernelThread { .. }
            | Error::NotStopped { .. }
            | Error::NoFileName { .. }
            | Error::BadPath { .. }
            | Error::MemoryType { .. } => libc::EINVAL,
            Error::Unsupported { .. } => libc::EOPNOTSUPP,
            Error::NoSuchProcess(_) | Error::ProcessExited(_) | Error::ProgramReplaced(_) => {
                libc::ESRCH
            }
            Error::PermissionDenied { .. } => libc::EPERM,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            Error::Corrupt { .. } => libc::EBADMSG,
            Error::ShimNotFound { .. }
            | Error::MissingField { .. }
            | Error::NoSuchContainer { .. }
            | Error::NotACgroup { .. } => libc::ENOENT,
            Error::AmbiguousContainer { .. } => libc::EINVAL,
            Error::ShimSilent { source, .. } => source.raw_os_error().unwrap_or(libc::EPROTO),
            Error::NeedsRoot { .. } | Error::NotAJournal { .. } => libc::EACCES,
            Error::SettingHeld { .. } | Error::DeviceBusy { .. } => libc::EBUSY,
            Error::Unmapped { .. } | Error::NoStack { .. } | Error::NotWritable { .. } => {
                libc::EFAULT
            }
            Error::Refused(r) if r.is_permanent() => libc::EOPNOTSUPP,
            Error::Refused(_) => libc::EBUSY,
        }
    }

    /// Its class (see [`ErrorClass`]).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Unaligned { .. }
            | Error::RangeOverflow { .. }
            | Error::Overlap { .. }
            | Error::NothingToMeasure
            | Error::NoCommand
            | Error::SelfTarget { .. }
            | Error::KernelThread { .. }
            | Error::NotStopped { .. }
            | Error::NoFileName { .. }
            | Error::BadPath { .. }
            | Error::NoSuchContainer { .. }
            | Error::NotACgroup { .. }
            | Error::AmbiguousContainer { .. } => ErrorClass::BadInput,
            Error::Unsupported { .. } | Error::MemoryType { .. } | Error::ShimNotFound { .. } => {
                ErrorClass::Unsupported
            }
            Error::Refused(r) if r.is_permanent() => ErrorClass::Unsupported,
            Error::Refused(r) if r.is_passing() => ErrorClass::Busy,
            Error::SettingHeld { .. } | Error::DeviceBusy { .. } => ErrorClass::Busy,
            Error::PermissionDenied { .. }
            | Error::NeedsRoot { .. }
            | Error::NotAJournal { .. } => ErrorClass::Permission,
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
                if crate::procfs::is_ending(pid) {
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
                    answer: Some(crate::seccomp::Action::Errno(1)),
                    why: "it was asked to".into(),
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
            (
                Error::NoSuchContainer {
                    which: "web".into(),
                },
                ErrorClass::BadInput,
                libc::ENOENT,
            ),
            (
                Error::AmbiguousContainer {
                    which: "ab12".into(),
                    count: 2,
                },
                ErrorClass::BadInput,
                libc::EINVAL,
            ),
            (
                Error::SettingHeld {
                    setting: "/sys/kernel/mm/ksm/run".into(),
                    holder: Holder::Unknown,
                },
                ErrorClass::Busy,
                libc::EBUSY,
            ),
        ];
        for (e, class, errno) in cases {
            assert_eq!(e.class(), class, "{e}");
            assert_eq!(e.errno(), errno, "{e}");
            assert_eq!(e.to_string().lines().count(), 1, "{e}");
        }
    }
}
