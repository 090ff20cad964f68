//! Mechanisms that act on the host: what its kernel offers, its
//! system-wide settings changed under a journal, memory cgroups and their
//! freezer, and files replaced whole.

pub mod cgroup;
pub mod files;
pub mod freezer;
pub mod probe;
pub mod settings;
