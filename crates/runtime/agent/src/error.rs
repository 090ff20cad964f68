//! The runtime's errors: a configuration that is wrong, or what the
//! mechanisms and agents under it met.

use pagewise_mech::ErrorClass;

/// An error of the agent runtime.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node agent's configuration is wrong (bad input).
    #[error("{path}: {why}")]
    Config {
        /// The configuration file.
        path: String,
        /// What is wrong in it.
        why: String,
    },
    /// A mechanism or an agent failed.
    #[error(transparent)]
    Mech(#[from] pagewise_mech::Error),
}

impl Error {
    /// Its class (see [`ErrorClass`]).
    pub(crate) fn class(&self) -> ErrorClass {
        match self {
            Error::Config { .. } => ErrorClass::BadInput,
            Error::Mech(e) => e.class(),
        }
    }

    /// The errno that says it best to C callers.
    pub(crate) fn errno(&self) -> i32 {
        match self {
            Error::Config { .. } => libc::EINVAL,
            Error::Mech(e) => e.errno(),
        }
    }
}

pagewise_mech::impl_failure!(Error);

/// Result of the agent runtime.
pub type Result<T, E = Error> = std::result::Result<T, E>;
