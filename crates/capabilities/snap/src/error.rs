//! What snapshots refuse or meet, besides the mechanisms' failures and
//! tracking's: each kind with the values it is about.

use pagewise_mech::ErrorClass;

use crate::SnapId;

mod kinds;
#[cfg(target_arch = "x86_64")]
pub use kinds::RollbackRefusal;
pub use kinds::{StoreError, WireError};

/// An error of snapshots.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A mechanism failed: a system call, the process went away, a
    /// feature this kernel lacks, a process that could not be stopped.
    #[error(transparent)]
    Mech(#[from] pagewise_mech::Error),
    /// Tracking the pages written failed.
    #[error(transparent)]
    Track(#[from] pagewise_track::Error),
    /// A durable store refused or lacked something (see the kinds).
    #[error("{0}")]
    Store(#[from] StoreError),
    /// A migration went wrong (see the kinds).
    #[error("{0}")]
    Wire(#[from] WireError),
    /// A rollback of another process was refused before anything changed
    /// (see the kinds).
    #[cfg(target_arch = "x86_64")]
    #[error("{0}")]
    Rollback(#[from] RollbackRefusal),
    /// No snapshot has this id (never taken, or dropped).
    #[error("no snapshot {id}")]
    NoSnapshot {
        /// The id asked for.
        id: SnapId,
    },
    /// No snapshot was taken yet.
    #[error("no snapshot taken yet")]
    NoneTaken,
    /// A snapshot of no region was asked for.
    #[error("no region to snapshot")]
    NoRegion,
    /// An address outside what was snapshotted.
    #[error("{addr:#x} is not in {}", match snapshot {
        Some(id) => format!("snapshot {id}"),
        None => "a snapshotted region".to_string(),
    })]
    NotSnapshotted {
        /// The address.
        addr: u64,
        /// The snapshot asked of (`None`: any).
        snapshot: Option<SnapId>,
    },
    /// A read that runs past the end of the region its address is in.
    #[error("{addr:#x}+{len:#x} runs past the end of its region {start:#x}..{end:#x}")]
    PastRegion {
        /// The address.
        addr: u64,
        /// The bytes asked for.
        len: u64,
        /// The region's first byte.
        start: u64,
        /// The byte after its end.
        end: u64,
    },
    /// A descriptor a restore opened again names another file than it did
    /// (the path was replaced while the restore ran).
    #[error(
        "process {pid}: descriptor {fd} opened again from {path} is not the file it was \
         (replaced while the restore ran)"
    )]
    DescriptorReplaced {
        /// The process.
        pid: i32,
        /// The descriptor.
        fd: i32,
        /// The path it was opened from.
        path: String,
    },
    /// The process serves its own page faults (a userfaultfd over some of
    /// its memory, as under far-memory emulation): stopped, it could not
    /// serve a snapshot's reads.
    #[error(
        "process {pid} serves its own page faults (a userfaultfd over {mappings} mappings, as \
         under `pagewise farmem run`): stopped, it could not serve the reads of a snapshot, and \
         the pages it keeps elsewhere are not at their addresses; snapshot it without its fault \
         handler (or far-memory emulation)"
    )]
    ServesOwnFaults {
        /// The process.
        pid: i32,
        /// Mappings its userfaultfd covers.
        mappings: usize,
    },
    /// The process holds a userfaultfd of its own (and may register its
    /// memory with it at any time): tracking its writes would register its
    /// memory with pagewise's first, and the kernel would refuse the
    /// program's own registration of it.
    #[error(
        "process {pid} holds a userfaultfd of its own: tracking its writes would register its \
         memory with pagewise's first, and a mapping it then registered itself would be refused \
         to it (EBUSY); take plain snapshots of it (without --live, --every-ms or a held session)"
    )]
    HoldsUserfaultfd {
        /// The process.
        pid: i32,
    },
    /// A shared mapping, or one of a deleted file, is gone or replaced and
    /// cannot be mapped again.
    #[error(
        "{start:#x}..{end:#x} ({}) was a mapping of {} that is gone or replaced: shared memory \
         and deleted files cannot be mapped again",
        if *shared { "shared" } else { "private" },
        if name.is_empty() { "shared anonymous memory" } else { name }
    )]
    MappingGone {
        /// The mapping's first byte.
        start: u64,
        /// The byte after its end.
        end: u64,
        /// Whether it was shared.
        shared: bool,
        /// What the kernel named it (empty: shared anonymous memory).
        name: String,
    },
    /// A mapped file is gone or replaced since the snapshot.
    #[error(
        "{path} was mapped at {start:#x}..{end:#x} and is gone or replaced since (inode {then} \
         then, {} now): it cannot be mapped again",
        now.map_or("none".to_string(), |i| i.to_string())
    )]
    FileReplaced {
        /// The file.
        path: String,
        /// The mapping's first byte.
        start: u64,
        /// The byte after its end.
        end: u64,
        /// Its inode then.
        then: u64,
        /// Its inode now (`None`: gone).
        now: Option<u64>,
    },
    /// A range that is empty, reversed or not page-aligned.
    #[error("{start:#x}-{end:#x}: the start must be below the end, both page-aligned")]
    BadRange {
        /// Its start.
        start: u64,
        /// Its end.
        end: u64,
    },
    /// A range not wholly inside a snapshot.
    #[error("{start:#x}-{end:#x} is not wholly inside snapshot {id} ({covered} bytes of it are)")]
    RangeNotInSnapshot {
        /// Its start.
        start: u64,
        /// Its end.
        end: u64,
        /// The snapshot.
        id: SnapId,
        /// Bytes of it the snapshot holds.
        covered: u64,
    },
    /// A snapshot's process record cannot be read.
    #[error("snapshot {id}: {why}")]
    BadRecord {
        /// The snapshot.
        id: SnapId,
        /// What the reader refused.
        why: String,
    },
    /// The snapshot an incremental one builds on lacks a page.
    #[error("snapshot {id} has no page {page}")]
    MissingPage {
        /// The snapshot built on.
        id: SnapId,
        /// The page's number in it.
        page: usize,
    },
    /// More or fewer pages were given than the regions hold.
    #[error("{pushed} pages pushed where the regions hold {expected}")]
    PageCount {
        /// Pages given.
        pushed: u64,
        /// Pages the regions hold.
        expected: u64,
    },
    /// pagewise's own bookkeeping is inconsistent: a bug, reported rather
    /// than turned into wrong data.
    #[error("internal error: {what}")]
    Internal {
        /// Which invariant broke.
        what: &'static str,
    },
}

impl Error {
    /// Its class (see [`ErrorClass`]).
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::Mech(e) => e.class(),
            Error::Track(e) => e.class(),
            Error::Store(StoreError::Locked { .. }) => ErrorClass::Busy,
            // A refusal, made before anything was changed, that no retry of
            // the same restore mends: each says what to do instead.
            #[cfg(target_arch = "x86_64")]
            Error::Rollback(_) => ErrorClass::Unsupported,
            Error::Store(_) | Error::Wire(_) => match self.errno() {
                libc::EACCES => ErrorClass::Permission,
                libc::EINVAL => ErrorClass::BadInput,
                _ => ErrorClass::Failed,
            },
            Error::NoRegion | Error::BadRange { .. } | Error::PageCount { .. } => {
                ErrorClass::BadInput
            }
            Error::ServesOwnFaults { .. }
            | Error::HoldsUserfaultfd { .. }
            | Error::MappingGone { .. }
            | Error::FileReplaced { .. } => ErrorClass::Unsupported,
            _ => ErrorClass::Failed,
        }
    }

    /// The errno that says it best.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Mech(e) => e.errno(),
            Error::Track(e) => e.errno(),
            Error::Store(s) => s.errno(),
            Error::Wire(w) => w.errno(),
            #[cfg(target_arch = "x86_64")]
            Error::Rollback(RollbackRefusal::MemoryOnly { .. }) => libc::EOPNOTSUPP,
            #[cfg(target_arch = "x86_64")]
            Error::Rollback(_) => libc::ESTALE,
            Error::NoSnapshot { .. } | Error::NoneTaken => libc::ENOENT,
            Error::NotSnapshotted { .. }
            | Error::PastRegion { .. }
            | Error::RangeNotInSnapshot { .. } => libc::EFAULT,
            Error::DescriptorReplaced { .. } => libc::ESTALE,
            Error::HoldsUserfaultfd { .. } => libc::EBUSY,
            Error::BadRecord { .. } => libc::EBADMSG,
            Error::Internal { .. } => libc::ENOTRECOVERABLE,
            _ => libc::EINVAL,
        }
    }
}

impl Error {
    /// The mechanism's failure this is, if it is one: met by snapshots
    /// themselves or by the tracking under them.
    pub fn mech(&self) -> Option<&pagewise_mech::Error> {
        match self {
            Error::Mech(e) | Error::Track(pagewise_track::Error::Mech(e)) => Some(e),
            _ => None,
        }
    }
}

/// The mechanisms' helpers, giving this error.
impl Error {
    /// An OS error met while doing `what`.
    pub(crate) fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::os(what, source).into()
    }

    /// An OS error met while working on process `pid`, as its clearest
    /// error (the process gone, permission denied).
    pub(crate) fn for_pid(pid: i32, what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::for_pid(pid, what, source).into()
    }
}

pagewise_mech::impl_failure!(Error);

/// Result of snapshots.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn structured_errors_say_their_class_and_errno() {
        let cases: Vec<(Error, ErrorClass, i32)> = vec![
            (
                StoreError::Locked { store: "/s".into() }.into(),
                ErrorClass::Busy,
                libc::EBUSY,
            ),
            (
                StoreError::NotOwned {
                    path: "/s".into(),
                    owner: 1,
                    you: 0,
                }
                .into(),
                ErrorClass::Permission,
                libc::EACCES,
            ),
            (
                StoreError::LabelTooLong { max: 4096 }.into(),
                ErrorClass::BadInput,
                libc::EINVAL,
            ),
            (
                WireError::ShortKey { len: 3 }.into(),
                ErrorClass::BadInput,
                libc::EINVAL,
            ),
            (
                WireError::KeyMismatch {
                    peer: "p".into(),
                    we_have_key: false,
                }
                .into(),
                ErrorClass::Permission,
                libc::EACCES,
            ),
            (
                WireError::BadTag { peer: "p".into() }.into(),
                ErrorClass::Failed,
                libc::EBADMSG,
            ),
            (
                Error::NoSnapshot { id: 3 },
                ErrorClass::Failed,
                libc::ENOENT,
            ),
            (
                Error::ServesOwnFaults {
                    pid: 7,
                    mappings: 2,
                },
                ErrorClass::Unsupported,
                libc::EINVAL,
            ),
            (
                Error::HoldsUserfaultfd { pid: 7 },
                ErrorClass::Unsupported,
                libc::EBUSY,
            ),
            (
                pagewise_mech::Error::ProcessExited(7).into(),
                ErrorClass::Gone,
                libc::ESRCH,
            ),
        ];
        for (e, class, errno) in cases {
            assert_eq!(e.class(), class, "{e}");
            assert_eq!(e.errno(), errno, "{e}");
            assert_eq!(e.to_string().lines().count(), 1, "{e}");
        }
        // The store's lock says what it is about.
        let e: Error = StoreError::Locked { store: "/s".into() }.into();
        assert_eq!(
            e.to_string(),
            "store /s is being written by another process: one writer at a time"
        );
    }

    /// Regression: a restore refused because the threads changed or the
    /// descriptors are gone exited 1 (failed); every refusal of a
    /// rollback is now the refusal class (exit 3), which no retry mends.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn every_refused_rollback_is_of_the_refusal_class() {
        for r in [
            RollbackRefusal::ThreadsChanged {
                pid: 1,
                id: 1,
                made: vec![2],
                ended: vec![],
            },
            RollbackRefusal::DescriptorsGone {
                pid: 1,
                id: 1,
                gone: vec!["3 (socket)".into()],
            },
            RollbackRefusal::MemoryOnly {
                pid: 1,
                why: "x".into(),
            },
            RollbackRefusal::ExecSince { pid: 1, stored: 1 },
            RollbackRefusal::ThreadMemoryDiverged {
                pid: 1,
                id: 1,
                tid: 1,
                word: 8,
                points_to: 16,
            },
        ] {
            let e = Error::Rollback(r);
            assert_eq!(e.class(), ErrorClass::Unsupported, "{e}");
        }
    }
}
