//! The kinds of snapshot errors raised by one part each: a durable store's
//! refusals ([`StoreError`]), a migration's ([`WireError`]) and a
//! rollback's ([`RollbackRefusal`]), each with the values it is about.

use std::path::PathBuf;

/// What went wrong with a durable store, other than damage
/// ([`pagewise_mech::Error::Corrupt`]) and the system's answers
/// ([`pagewise_mech::Error::Os`]): each kind with the store, file or
/// snapshot it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// A file or directory of the store belongs to another user.
    #[error("{} belongs to user {owner}, not to you (user {you}): a store must be its user's own, or another user could read the memory saved in it", path.display())]
    NotOwned {
        /// The file or directory.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// The caller.
        you: u32,
    },
    /// The store's directory may be written by other users.
    #[error("{} may be written by other users (mode {mode:o}): a store's directory must be its user's alone", path.display())]
    WritableByOthers {
        /// The directory.
        path: PathBuf,
        /// Its mode.
        mode: u32,
    },
    /// The directory is not a store.
    #[error("{} is not a pagewise snapshot store (it has no {file} file)", dir.display())]
    NotAStore {
        /// The directory.
        dir: PathBuf,
        /// The file every store holds at its top.
        file: &'static str,
    },
    /// No snapshot of that id.
    #[error("store {} has no snapshot {id}", store.display())]
    NoSnapshot {
        /// The store.
        store: PathBuf,
        /// The id asked for.
        id: u64,
    },
    /// Another process writes the store.
    #[error("store {} is being written by another process: one writer at a time", store.display())]
    Locked {
        /// The store.
        store: PathBuf,
    },
    /// The store was opened read-only.
    #[error("store {} was opened read-only", store.display())]
    ReadOnly {
        /// The store.
        store: PathBuf,
    },
    /// A label too long.
    #[error("label longer than {max} bytes")]
    LabelTooLong {
        /// The most a label holds.
        max: usize,
    },
    /// Every snapshot id is used.
    #[error("store {} has used every snapshot id", store.display())]
    IdsExhausted {
        /// The store.
        store: PathBuf,
    },
    /// More pages pushed to a writer than its regions hold.
    #[error("more pages pushed than the regions hold")]
    TooManyPages,
    /// A snapshot of another store given as this store's.
    #[error("snapshot {id} is not in store {}", store.display())]
    NotInStore {
        /// The store.
        store: PathBuf,
        /// The snapshot.
        id: u64,
    },
    /// A snapshot restored into regions of other sizes.
    #[error("snapshot {id} has regions of sizes {sizes:?}, the destination {want:?}")]
    ShapeMismatch {
        /// The snapshot.
        id: u64,
        /// Its regions' sizes.
        sizes: Vec<u64>,
        /// The destination's.
        want: Vec<u64>,
    },
}

impl StoreError {
    /// The errno that says it to C callers.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            StoreError::NotOwned { .. }
            | StoreError::WritableByOthers { .. }
            | StoreError::ReadOnly { .. } => libc::EACCES,
            StoreError::NotAStore { .. }
            | StoreError::NoSnapshot { .. }
            | StoreError::NotInStore { .. } => libc::ENOENT,
            StoreError::Locked { .. } => libc::EBUSY,
            StoreError::IdsExhausted { .. } => libc::ENOSPC,
            _ => libc::EINVAL,
        }
    }
}

/// What went wrong with a migration, other than the system's answers
/// ([`pagewise_mech::Error::Os`]): each kind with the peer, key or value
/// it is about.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A key shorter than 16 bytes.
    #[error("a key of {len} bytes: at least 16 are needed")]
    ShortKey {
        /// Its length.
        len: usize,
    },
    /// A key file that others may read, or that is not the caller's.
    #[error("the key {} must be yours and readable by you alone (chmod 600), not mode {mode:o} of user {owner}", path.display())]
    KeyNotPrivate {
        /// The file.
        path: PathBuf,
        /// Its mode.
        mode: u32,
        /// Its owner.
        owner: u32,
    },
    /// An address that does not resolve.
    #[error("address {addr}: {why}")]
    BadAddress {
        /// The address given.
        addr: String,
        /// Why.
        why: String,
    },
    /// The peer speaks another protocol or version.
    #[error("the connection with {peer} is corrupt: the receiver speaks magic {magic:#x} version {version}, want {want_magic:#x} version {want_version}")]
    OtherVersion {
        /// The peer.
        peer: String,
        /// Its magic.
        magic: u32,
        /// Its version.
        version: u32,
        /// The magic this end speaks.
        want_magic: u32,
        /// The version this end speaks.
        want_version: u32,
    },
    /// One end has a key and the other not.
    #[error("the receiver at {peer} refused the connection: {}", if *we_have_key { "it has no key (give both ends the same --key)" } else { "it needs a key (--key FILE, the same at both ends)" })]
    KeyMismatch {
        /// The peer.
        peer: String,
        /// Whether this end has a key.
        we_have_key: bool,
    },
    /// The receiver refused, saying why.
    #[error("the connection with {peer} is corrupt: the receiver refused ({reason})")]
    Refused {
        /// The peer.
        peer: String,
        /// What it said.
        reason: String,
    },
    /// A reply out of turn.
    #[error("the connection with {peer} is corrupt: reply {:?} where {:?} was due", *got as char, *want as char)]
    UnexpectedReply {
        /// The peer.
        peer: String,
        /// The reply's tag.
        got: u8,
        /// The tag due.
        want: u8,
    },
    /// A reply whose authentication tag is wrong.
    #[error("the connection with {peer} is corrupt: a reply whose authentication tag is wrong (another key?)")]
    BadTag {
        /// The peer.
        peer: String,
    },
    /// More regions than the wire carries.
    #[error("{n} regions: the wire carries at most {max}")]
    TooManyRegions {
        /// Regions asked for.
        n: usize,
        /// The most the wire carries.
        max: u32,
    },
    /// A label too long.
    #[error("label longer than {max} bytes")]
    LabelTooLong {
        /// The most a label holds.
        max: u32,
    },
}

impl WireError {
    /// The errno that says it to C callers.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            WireError::ShortKey { .. }
            | WireError::BadAddress { .. }
            | WireError::LabelTooLong { .. } => libc::EINVAL,
            WireError::KeyNotPrivate { .. } | WireError::KeyMismatch { .. } => libc::EACCES,
            WireError::TooManyRegions { .. } => libc::ENOSPC,
            _ => libc::EBADMSG,
        }
    }
}

/// Why a rollback was refused before anything was changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RollbackRefusal {
    /// Threads were made or ended since the snapshot.
    #[error(
        "process {pid}: its threads changed since snapshot {id} (made since: {made:?}, ended \
         since: {ended:?}); registers are put back only into the threads they were taken \
         from: restore memory and layout alone with --memory-only (refused in turn where \
         what the threads keep would not match it)"
    )]
    ThreadsChanged {
        /// The process.
        pid: i32,
        /// The snapshot.
        id: u64,
        /// Threads made since.
        made: Vec<i32>,
        /// Threads ended since.
        ended: Vec<i32>,
    },
    /// A memory-only restore would leave a thread's own memory (its live
    /// stack, its thread-local data), which it keeps, pointing at memory
    /// the restore puts back to other contents.
    #[error(
        "process {pid}: thread {tid}'s own memory changed since snapshot {id} and now points \
         at memory a memory-only restore would put back ({word:#x} holds {points_to:#x}): the \
         thread keeps its stack and thread-local data (an allocator's per-thread cache, say), \
         which would no longer match; restore in full (without --memory-only, the threads the \
         snapshot's), or restart the program"
    )]
    ThreadMemoryDiverged {
        /// The process.
        pid: i32,
        /// The snapshot.
        id: u64,
        /// The thread.
        tid: i32,
        /// The word of the thread's memory.
        word: u64,
        /// Where it points.
        points_to: u64,
    },
    /// Nothing can be done inside the process: only memory can be put back.
    #[error(
        "process {pid}: {why}; only memory can be put back (the layout needs calls made \
         inside the process, the registers ptrace): restore with --memory-only"
    )]
    MemoryOnly {
        /// The process.
        pid: i32,
        /// Why.
        why: String,
    },
    /// A stored snapshot of another process (or of an earlier process with
    /// the same pid).
    #[error(
        "snapshot {stored} of the store was taken of {}, not of process {pid} as it runs now: \
         restoring it here needs --another-process",
        match then { Some(p) => format!("process {p} (started at another time, or another pid)"), None => "the caller's own regions".to_string() }
    )]
    AnotherProcess {
        /// The process restored into.
        pid: i32,
        /// The snapshot's id in the store.
        stored: u64,
        /// The process it was taken of.
        then: Option<i32>,
    },
    /// Descriptors the snapshot had are gone and cannot be opened again
    /// (a socket, a pipe, a file deleted or replaced since).
    #[error(
        "process {pid}: descriptors snapshot {id} had are gone and cannot be opened again: {}; \
         the program's memory would name them: restore anyway, leaving them closed, with \
         --ignore-missing-fds",
        gone.join(", ")
    )]
    DescriptorsGone {
        /// The process.
        pid: i32,
        /// The snapshot.
        id: u64,
        /// Each as `N (kind target)`.
        gone: Vec<String>,
    },
    /// A stored snapshot of the same process before it replaced its program
    /// (`exec`): the program running now is another.
    #[error(
        "snapshot {stored} of the store was taken of process {pid} before it replaced its \
         program (exec): the program running now is another; restoring it here needs \
         --another-process"
    )]
    ExecSince {
        /// The process restored into.
        pid: i32,
        /// The snapshot's id in the store.
        stored: u64,
    },
    /// A memory-only restore without calls inside the process met a layout
    /// that is not the snapshot's.
    #[error(
        "process {pid}: its mappings changed since snapshot {id} ({first}) and nothing can be \
         done inside it to put them back"
    )]
    LayoutChanged {
        /// The process.
        pid: i32,
        /// The snapshot.
        id: u64,
        /// The first change.
        first: String,
    },
    /// A CRIU dump put in place meets mappings other than the dump's:
    /// pagewise writes pages into the mappings there are and makes none.
    #[error(
        "process {pid}: its mappings are not those of the CRIU dump in {dir} ({first}); \
         pages are put in place only into the dump's own mappings: restore that dump with \
         criu restore"
    )]
    CriuLayout {
        /// The process.
        pid: i32,
        /// The dump's directory.
        dir: String,
        /// The first difference.
        first: String,
    },
    /// CRIU images that cannot be put in place.
    #[error("the CRIU dump in {dir} cannot be put in place: {why}")]
    CriuImages {
        /// The dump's directory.
        dir: String,
        /// Why.
        why: String,
    },
}
