//! pagewise's mechanisms: what every capability uses, each in one place,
//! over the raw calls of `pagewise-sys`. A mechanism imports other
//! mechanisms, never a capability (the capabilities are crates above this
//! one, so the compiler keeps that rule).
//!
//! Users reach them through the facade (`pagewise`), which re-exports
//! those a user may need (the agent frame, access coverage, page walks and
//! their cost, write-protect, digests, regions, the probe) and, in hidden
//! modules, what pagewise's own faces need (parsing `/proc`, children and
//! system settings, cgroups, the preload shim's contract). The faces never
//! depend on this crate; the other layers and the tests do. Modules hidden
//! from these docs may change without notice.

/// Builder methods for an options struct, one per field named: `fn
/// field(self, value) -> Self`, so that callers outside the crate that
/// defines it (where the struct is `#[non_exhaustive]`) build it from its
/// `Default`.
#[doc(hidden)]
#[macro_export]
macro_rules! setters {
    ($ty:ty { $($field:ident : $t:ty),* $(,)? }) => {
        impl $ty {
            $(
                #[doc = concat!("Sets [`", stringify!($field), "`](Self::", stringify!($field), ").")]
                #[must_use]
                pub fn $field(mut self, value: $t) -> Self {
                    self.$field = value;
                    self
                }
            )*
        }
    };
}

mod error;
// The mechanisms, in folders by what they act on; each module is reached
// from the crate root (`pagewise_mech::walk`, ...).
mod host;
mod pages;
mod process;

pub use error::{Error, ErrorClass, Failure, Holder, Result};
pub use pagewise_sys::{HUGE_PAGE_SIZE, PAGE_SIZE};
pub use region::{PageRange, Region};
pub use stop::Refusal;

pub use host::probe;
#[doc(hidden)]
pub use host::{cgroup, files, freezer, settings};
pub use pages::{access, anon, bloom, fault, hash, region, walk, walk_cost, workload, wp};
pub use process::{agent, remote};
#[doc(hidden)]
pub use process::{child, container, inject, procfs, seccomp, shim, stop};
