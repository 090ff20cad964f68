//! Any error of the library, for a caller that uses several capabilities
//! and wants one type to `?` into: each capability's own error (or the
//! mechanisms') kept whole, so that a caller still matches its kinds.

use pagewise_mech::{ErrorClass, Failure};

/// Any error of the library: the mechanisms' or a capability's, kept
/// whole (match on it to reach the kind), with its class and errno.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A mechanism failed (a system call, the process went away, a feature
    /// this kernel lacks); also what `inspect`, `thp` and `dedup` return.
    #[error(transparent)]
    Mech(#[from] pagewise_mech::Error),
    /// Tracking failed.
    #[error(transparent)]
    Track(#[from] pagewise_track::Error),
    /// A snapshot, store, migration or rollback failed.
    #[error(transparent)]
    Snap(#[from] pagewise_snap::Error),
    /// Far-memory emulation failed.
    #[error(transparent)]
    Farmem(#[from] pagewise_farmem::Error),
    /// The agent runtime failed (a node agent's configuration, say).
    #[error(transparent)]
    Agent(#[from] pagewise_agent::Error),
}

impl Error {
    /// Its class (see [`ErrorClass`]).
    pub(crate) fn class(&self) -> ErrorClass {
        self.inner().class()
    }

    /// The errno that says it best to C callers and over the wire.
    pub(crate) fn errno(&self) -> i32 {
        self.inner().errno()
    }

    /// An OS error met while doing `what`, for a caller's own calls.
    pub fn os(what: impl Into<String>, source: std::io::Error) -> Self {
        pagewise_mech::Error::os(what, source).into()
    }

    fn inner(&self) -> &dyn Failure {
        match self {
            Error::Mech(e) => e,
            Error::Track(e) => e,
            Error::Snap(e) => e,
            Error::Farmem(e) => e,
            Error::Agent(e) => e,
        }
    }
}

pagewise_mech::impl_failure!(Error);

/// Result of the library.
pub type Result<T, E = Error> = std::result::Result<T, E>;
