//! pagewise: page-level memory management on a stock Linux kernel, from user space.
//!
//! The library is the product; the `pagewise` CLI, the preload shim and the C
//! API are thin layers over it. It has two layers (see `ARCHITECTURE.md`):
//!
//! **Capabilities**, each one system of the papers, at the crate root:
//!
//! | module | capability |
//! |---|---|
//! | [`track`] | dirty-page tracking (LDT): which pages were written since a consumer last asked |
//! | [`snap`] | same-page-merging snapshots (SimGrid); built on `track` |
//! | [`farmem`] | disaggregated-memory emulation (DiME) |
//! | [`inspect`] | residency, huge pages, bloat, duplicates and access coverage of any process |
//! | [`thp`] | huge-page policy (HawkEye) |
//! | [`dedup`] | deduplication with mixed pages (SmartMD) |
//!
//! A capability imports mechanisms, never another capability (except
//! `snap`, built on `track`).
//!
//! **Mechanisms** ([`mech`]), what every capability uses, each in one
//! place: what the kernel offers ([`probe`]), page-table walks
//! ([`mech::walk`]) and their cost ([`mech::walk_cost`]), userfaultfd
//! write-protect ([`mech::wp`]), access coverage ([`mech::access`]),
//! digests and the Bloom filter ([`mech::hash`], [`mech::bloom`]), the
//! frame of the agents ([`mech::agent`]); and, for pagewise's own faces,
//! `/proc`, stopping a process and acting inside it, system-setting guards,
//! cgroups and the preload shim's contract (hidden from these docs).
//!
//! Errors say their class ([`Error::class`]): bad input, unsupported here,
//! not permitted, the process went away, busy now (try again later), or
//! failed.

/// Builder methods for an options struct, one per field named: `fn
/// field(self, value) -> Self`, so that callers outside the library (where
/// the struct is `#[non_exhaustive]`) build it from its `Default`.
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

mod cap;
mod error;
pub mod mech;
#[doc(hidden)]
pub mod workload;

pub use cap::{dedup, farmem, inspect, snap, thp, track};
pub use error::{Error, ErrorClass, Result};
pub use mech::probe;
pub use mech::region::{PageRange, Region};
pub use mech::stop::Refusal;
pub use pagewise_sys::{HUGE_PAGE_SIZE, PAGE_SIZE};
