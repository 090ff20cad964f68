//! The kinds of the library's structured errors, each with the values it
//! is about: a process that cannot be stopped or acted inside
//! ([`Refusal`]), a durable store's refusals ([`StoreError`]), a
//! migration's ([`WireError`]) and a rollback's ([`RollbackRefusal`]).
//! They live here, beside [`Error`](super::Error) that carries them, so that
//! the vocabulary every module uses depends on no module above it; the
//! modules that raise them re-export them (`mech::stop::Refusal`,
//! `snap::StoreError`, `snap::wire::WireError`, `snap::RollbackRefusal`).

use std::path::PathBuf;

/// Why pagewise could not stop a process or act inside it: a refusal
/// before anything was done (the process cannot be acted in here), or a
/// stop or a call that did not complete (worth trying again). Each says
/// which process and thread.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The process runs under a seccomp filter.
    #[error("{feature} is not available: process {pid} runs under a seccomp filter: {call} made inside it could be refused or kill it")]
    Seccomp {
        /// What needed the call.
        feature: &'static str,
        /// The process.
        pid: i32,
        /// The call.
        call: String,
    },
    /// Another tracer holds the process.
    #[error("process {pid} is traced by process {tracer} (a debugger or another tool): {feature} must stop it under ptrace itself, and a process has one tracer")]
    Traced {
        /// What needed to stop it.
        feature: &'static str,
        /// The process.
        pid: i32,
        /// Its tracer.
        tracer: u64,
    },
    /// Its user stopped it (job control or a debugger).
    #[error("{feature} is not available: process {pid} is stopped (job control or a debugger): it cannot make {call} until it runs again")]
    JobStopped {
        /// What needed the call.
        feature: &'static str,
        /// The process.
        pid: i32,
        /// The call.
        call: String,
    },
    /// Calls inside another process are made on x86-64 only.
    #[error("system calls inside another process is not available: implemented for x86-64 only")]
    NotX86_64,
    /// A thread's mode (64- or 32-bit) could not be read.
    #[error("system calls inside another process is not available: the mode (64- or 32-bit) of thread {tid} of process {pid} cannot be read: {why}")]
    ModeUnknown {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// What the kernel said.
        why: String,
    },
    /// A thread runs 32-bit code.
    #[error("system calls inside another process is not available: thread {tid} of process {pid} runs 32-bit code (code segment {cs:#x}): a call made in it would enter the 32-bit system-call table; only 64-bit processes are acted in")]
    Compat32 {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// Its code segment.
        cs: u64,
    },
    /// A thread switched to 32-bit code while stopped.
    #[error("system calls inside another process is not available: thread {tid} of process {pid} switched to 32-bit code")]
    SwitchedTo32 {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A signal came before each try of a call.
    #[error("process {pid}: a signal arrived before each of {tries} tries of a system call made in it (each was delivered); try again")]
    Signals {
        /// The process.
        pid: i32,
        /// Tries made.
        tries: u32,
    },
    /// A call made in a thread did not return.
    #[error("a system call made in thread {tid} of process {pid} did not return")]
    NoReturn {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A thread stopped otherwise than the call's step.
    #[error("thread {tid} of process {pid} stopped with signal {sig} at {rip:#x} while a system call was made in it")]
    StrangeStop {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// The signal.
        sig: i32,
        /// Where.
        rip: u64,
    },
    /// A thread waits for a child it vforked.
    #[error("thread {tid} of process {pid} is waiting for a child it vforked to exec or exit, and cannot be stopped until then; try again later")]
    InVfork {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// A thread did not stop in time.
    #[error("thread {tid} of process {pid} did not stop in time (an uninterruptible wait, such as a vfork parent's)")]
    NotStopping {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
    /// Threads were made faster than they could be found and stopped: the
    /// kernel counts more threads than were held when the time ran out.
    #[error(
        "process {pid} makes threads faster than they can be stopped: {held} held, the kernel \
         counts {counted}, after {ms} ms; try again"
    )]
    ThreadsUncounted {
        /// The process.
        pid: i32,
        /// Threads held.
        held: usize,
        /// Threads the kernel counts (`Threads:` in its status).
        counted: usize,
        /// How long it tried.
        ms: u64,
    },
    /// A thread took signal after signal on its way into a stop.
    #[error(
        "thread {tid} of process {pid} took {n} signals in a row on its way into a stop; try again"
    )]
    SignalStorm {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
        /// Signals handed back.
        n: u32,
    },
    /// A thread has not yet left the wait that kept it from stopping before.
    #[error("thread {tid} of process {pid} has not yet left the wait that kept it from stopping the last time; try again later")]
    Straggler {
        /// The process.
        pid: i32,
        /// The thread.
        tid: i32,
    },
}

impl Refusal {
    /// Whether the refusal is for now (another tracer holds the process,
    /// a `vfork` is in progress, a thread would not stop): trying again
    /// later may succeed. The class of the error.
    pub fn is_passing(&self) -> bool {
        matches!(
            self,
            Refusal::Traced { .. }
                | Refusal::InVfork { .. }
                | Refusal::NotStopping { .. }
                | Refusal::ThreadsUncounted { .. }
                | Refusal::SignalStorm { .. }
                | Refusal::Straggler { .. }
                | Refusal::Signals { .. }
        )
    }

    /// Whether the process cannot be acted in here at all (rather than
    /// this time): the class of the error.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Refusal::Seccomp { .. }
                | Refusal::JobStopped { .. }
                | Refusal::NotX86_64
                | Refusal::ModeUnknown { .. }
                | Refusal::Compat32 { .. }
                | Refusal::SwitchedTo32 { .. }
        )
    }
}

/// What went wrong with a durable store, other than damage
/// ([`Error::Corrupt`](super::Error::Corrupt)) and the system's answers
/// ([`Error::Os`](super::Error::Os)): each kind with the store, file or
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
    pub fn errno(&self) -> i32 {
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
/// ([`Error::Os`](super::Error::Os)): each kind with the peer, key or value
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
    pub fn errno(&self) -> i32 {
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
         from: restore memory and layout alone with --memory-only"
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
}
