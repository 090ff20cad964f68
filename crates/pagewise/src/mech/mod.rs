//! Mechanisms: what every capability uses, each in one place. A mechanism
//! imports other mechanisms and the raw calls of `pagewise-sys`, never a
//! capability.

pub mod access;
pub mod agent;
pub mod anon;
pub mod bloom;
pub mod cgroup;
pub mod child;
pub mod files;
pub mod hash;
pub mod inject;
pub mod probe;
pub mod procfs;
pub mod region;
pub mod settings;
pub mod shim;
pub mod stop;
pub mod walk;
pub mod walk_cost;
pub mod wp;
