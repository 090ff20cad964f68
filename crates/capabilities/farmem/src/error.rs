//! What far-memory emulation refuses or meets, besides the mechanisms'
//! failures: each kind with the values it is about.

use pagewise_mech::ErrorClass;
use std::path::PathBuf;
use std::time::Duration;

/// An error of far-memory emulation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A mechanism failed: a system call, the process went away, a
    /// feature this kernel lacks, memory of a type not emulated.
    #[error(transparent)]
    Mech(#[from] pagewise_mech::Error),
    /// A setting out of its range.
    #[error("{key} {value}: use {range}")]
    BadSetting {
        /// The setting.
        key: &'static str,
        /// The value given.
        value: u64,
        /// What it may be.
        range: &'static str,
    },
    /// An instance setting that does not exist.
    #[error("unknown key {key:?}: use latency_ns, bandwidth_bps, local_npages or local_percent")]
    UnknownKey {
        /// The key given.
        key: String,
    },
    /// Emulation of no region was asked for.
    #[error("no region to emulate")]
    NoRegion,
    /// A fault path that does not exist.
    #[error("unknown fault path {name:?} (thread or inline)")]
    UnknownFaultPath {
        /// The name given.
        name: String,
    },
    /// Too many engines serve faults inline in this process.
    #[error("at most {max} far-memory engines may serve faults inline in one process")]
    TooManyInlineEngines {
        /// The most there may be.
        max: usize,
    },
    /// A region to emulate overlaps one emulated already.
    #[error("{start:#x}+{len:#x} overlaps an emulated region")]
    Overlaps {
        /// Its start.
        start: u64,
        /// Its length.
        len: u64,
    },
    /// A range that is not inside one emulated region.
    #[error("{start:#x}+{len:#x} is not inside one emulated region")]
    NotEmulated {
        /// Its start.
        start: u64,
        /// Its length.
        len: u64,
    },
    /// The engine's handler thread panicked.
    #[error("the far-memory handler thread panicked: {message}")]
    EnginePanicked {
        /// What it said.
        message: String,
    },
    /// The engine's handler thread is gone (it died, or was stopped).
    #[error("the far-memory handler thread is gone")]
    EngineGone,
    /// Processes that did not send their coverage report in time.
    #[error("no coverage report from process {pids:?} within {waited:?}")]
    NoCoverageReport {
        /// The processes.
        pids: Vec<i32>,
        /// How long they were waited for.
        waited: Duration,
    },
    /// The directory of instances is not safe to use.
    #[error(
        "{} is not a safe instance directory (a directory owned by you or root, sticky where \
         others may write): owner uid {uid}, mode {mode:o}; set PAGEWISE_FARMEM_DIR",
        dir.display()
    )]
    UnsafeDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its mode.
        mode: u32,
    },
    /// A directory of servers' sockets (or one above it) that others could
    /// write.
    #[error(
        "{} cannot hold a far-memory server's socket: only root or the user running the \
         server may own it and the directories above it, and no one else write them \
         (owner uid {uid}, mode {mode:o}); set PAGEWISE_FARMEM_SOCKETS to such a directory",
        dir.display()
    )]
    UnsafeSocketDirectory {
        /// The directory.
        dir: PathBuf,
        /// Its owner.
        uid: u32,
        /// Its mode.
        mode: u32,
    },
    /// An instance name that is not of the allowed characters or length.
    #[error("instance name {name:?}: use 1-64 letters, digits, '-', '_' or '.'")]
    BadInstanceName {
        /// The name given.
        name: String,
    },
    /// An instance to create exists already.
    #[error("instance {name} exists already")]
    InstanceExists {
        /// The instance.
        name: String,
    },
    /// No instance has this name.
    #[error("no far-memory instance {name} (see `pagewise farmem ls`)")]
    NoInstance {
        /// The name asked for.
        name: String,
    },
    /// An instance that does not exist, named without the settings to
    /// create it.
    #[error("instance {name} does not exist: give its settings to create it")]
    NeedsSettings {
        /// The instance.
        name: String,
    },
    /// The instance belongs to another user.
    #[error("instance {name} belongs to {}: only its owner may {}",
        owner.map_or("another user".to_string(), |u| format!("uid {u}")),
        if *join { "run programs in it" } else { "change it" })]
    NotOwner {
        /// The instance.
        name: String,
        /// Its owner, where known.
        owner: Option<u32>,
        /// Whether joining it was asked (else changing it).
        join: bool,
    },
    /// A change asked of an instance opened read-only.
    #[error("instance {name} opened read-only")]
    ReadOnly {
        /// The instance.
        name: String,
    },
    /// The instance has as many members as it can hold.
    #[error("instance {name} has {max} members already")]
    TooManyMembers {
        /// The instance.
        name: String,
        /// The most it holds.
        max: usize,
    },
    /// A far-memory instance exists with settings other than those asked
    /// for.
    #[error(
        "instance {name} exists with other settings: join it without them, or change them \
         with `pagewise farmem set {name} key=value`"
    )]
    InstanceConflict {
        /// The instance.
        name: String,
    },
    /// A policy plugin failed to load or start.
    #[error("policy plugin {path}: {what}")]
    Plugin {
        /// The plugin's path.
        path: String,
        /// What went wrong (the loader's or the plugin's words).
        what: String,
    },
    /// The engine's books disagree with the page tables: a bug, reported
    /// rather than turned into wrong data.
    #[error("the books disagree with the page tables at {addr:#x}: {state}")]
    BooksWrong {
        /// The page.
        addr: u64,
        /// What the books and the page tables say of it.
        state: String,
    },
    /// pagewise's own bookkeeping is inconsistent: a bug, reported rather
    /// than turned into wrong data.
    #[error("internal error: {what} (at {addr:#x})")]
    Internal {
        /// Which invariant broke.
        what: &'static str,
        /// The address it is about (0: none).
        addr: u64,
    },
}

impl Error {
    /// Its class (see [`ErrorClass`]).
    pub(crate) fn class(&self) -> ErrorClass {
        match self {
            Error::Mech(e) => e.class(),
            Error::BadSetting { .. }
            | Error::UnknownKey { .. }
            | Error::NoRegion
            | Error::UnknownFaultPath { .. }
            | Error::TooManyInlineEngines { .. }
            | Error::BadInstanceName { .. }
            | Error::NeedsSettings { .. } => ErrorClass::BadInput,
            Error::UnsafeDirectory { .. }
            | Error::UnsafeSocketDirectory { .. }
            | Error::NotOwner { .. }
            | Error::ReadOnly { .. } => ErrorClass::Permission,
            _ => ErrorClass::Failed,
        }
    }

    /// The errno that says it best.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            Error::Mech(e) => e.errno(),
            Error::Overlaps { .. } | Error::InstanceExists { .. } => libc::EEXIST,
            Error::InstanceConflict { .. } => libc::EEXIST,
            Error::NotEmulated { .. } => libc::EFAULT,
            Error::EnginePanicked { .. } | Error::EngineGone => libc::EPIPE,
            Error::NoCoverageReport { .. } => libc::ETIMEDOUT,
            Error::UnsafeDirectory { .. }
            | Error::UnsafeSocketDirectory { .. }
            | Error::NotOwner { .. }
            | Error::ReadOnly { .. } => libc::EACCES,
            Error::NoInstance { .. } => libc::ENOENT,
            Error::TooManyMembers { .. } => libc::ENOSPC,
            Error::Plugin { .. } => libc::ELIBBAD,
            Error::BooksWrong { .. } | Error::Internal { .. } => libc::ENOTRECOVERABLE,
            _ => libc::EINVAL,
        }
    }
}

/// The mechanisms' helpers, giving this error.
impl Error {
    /// An OS error met while doing `what`.
    pub(crate) fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::os(what, source).into()
    }
}

pagewise_mech::impl_failure!(Error);

/// Result of far-memory emulation.
pub type Result<T, E = Error> = std::result::Result<T, E>;
