//! Mechanisms: what every capability uses, each in one place. A mechanism
//! imports other mechanisms and the raw calls of `pagewise-sys`, never a
//! capability.
//!
//! Those documented here are for users too: the agent frame, access
//! coverage, page walks and their cost, write-protect, digests and the
//! Bloom filter, regions, owned memory and the probe. The others (parsing
//! `/proc`, stopping a process and acting inside it, system settings and
//! cgroups, the preload shim's contract, children and files) are public
//! for pagewise's own faces (the tool, the shim, the C API, the
//! benchmarks) and hidden from these docs: they may change without notice.

pub mod access;
pub mod agent;
pub mod anon;
pub mod bloom;
#[doc(hidden)]
pub mod cgroup;
#[doc(hidden)]
pub mod child;
pub mod fault;
#[doc(hidden)]
pub mod files;
pub mod hash;
#[doc(hidden)]
pub mod inject;
#[doc(hidden)]
pub mod layout;
pub mod probe;
#[doc(hidden)]
pub mod procfs;
pub mod region;
#[doc(hidden)]
pub mod settings;
#[doc(hidden)]
pub mod shim;
#[doc(hidden)]
pub mod stop;
#[doc(hidden)]
#[cfg(target_arch = "x86_64")]
pub mod threads;
pub mod walk;
pub mod walk_cost;
pub mod wp;
