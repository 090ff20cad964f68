//! What tracking refuses or meets, besides the mechanisms' failures.

use pagewise_mech::ErrorClass;

/// An error of tracking.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A mechanism failed: a system call, the process went away, a
    /// feature this kernel lacks, a process that could not be stopped.
    #[error(transparent)]
    Mech(#[from] pagewise_mech::Error),
    /// No consumer has this id (never registered, or removed).
    #[error("consumer {id} does not exist")]
    NoConsumer {
        /// The id asked for.
        id: usize,
    },
    /// The memory is registered with another userfaultfd of this process
    /// already.
    #[error(
        "{start:#x}..{end:#x} is registered with another userfaultfd already: a tracker or \
         a snapshot set of this process (pagewise.Tracker, Snapshots) over the same memory \
         holds it until it is dropped (closed), or the program registered it"
    )]
    HeldElsewhere {
        /// The first byte of the memory.
        start: u64,
        /// The byte after its end.
        end: u64,
    },
    /// The mprotect backend's table of regions is full.
    #[error("the mprotect backend tracks at most {max} regions per process")]
    TooManyRegions {
        /// The most it tracks.
        max: usize,
    },
}

impl Error {
    /// Its class (see [`ErrorClass`]).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Mech(e) => e.class(),
            Error::HeldElsewhere { .. } => ErrorClass::Busy,
            Error::NoConsumer { .. } | Error::TooManyRegions { .. } => ErrorClass::Failed,
        }
    }

    /// The errno that says it best.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Mech(e) => e.errno(),
            Error::NoConsumer { .. } => libc::ENOENT,
            Error::HeldElsewhere { .. } => libc::EBUSY,
            Error::TooManyRegions { .. } => libc::ENOSPC,
        }
    }
}

/// The mechanisms' helpers, giving this error.
impl Error {
    /// An OS error met while doing `what`.
    pub(crate) fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::os(what, source).into()
    }

    /// An OS error met while working on process `pid` (`None`: this one).
    pub(crate) fn at(pid: Option<i32>, what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::at(pid, what, source).into()
    }

    /// An OS error met while working on process `pid`, as its clearest
    /// error (the process gone, permission denied).
    pub(crate) fn for_pid(pid: i32, what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::for_pid(pid, what, source).into()
    }
}

pagewise_mech::impl_failure!(Error);

/// Result of tracking.
pub type Result<T, E = Error> = std::result::Result<T, E>;
