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

#![forbid(unsafe_code)]

pub use pagewise_dedup as dedup;
pub use pagewise_farmem as farmem;
pub use pagewise_inspect as inspect;
pub use pagewise_snap as snap;
pub use pagewise_thp as thp;
pub use pagewise_track as track;

pub use pagewise_mech as mech;
#[doc(hidden)]
pub use pagewise_mech::workload;
pub use pagewise_mech::{probe, Error, ErrorClass, PageRange, Refusal, Region, Result};
pub use pagewise_mech::{HUGE_PAGE_SIZE, PAGE_SIZE};
