//! Mechanisms that act on a process: what `/proc` says of it, stopping
//! it and acting inside it (under its seccomp filters), its memory read
//! and written from outside, the container it is in, the program a tool
//! starts, the preload shim's contract, and the frame agents watch
//! processes with.

pub mod agent;
pub mod child;
pub mod container;
pub mod inject;
pub mod procfs;
pub mod remote;
pub mod seccomp;
pub mod shim;
pub mod stop;
