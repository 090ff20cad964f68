//! Huge-page policy (HawkEye): bloat, access coverage and promotion by benefit.
//!
//! Here: the agent that promotes 2 MiB regions by write coverage under a
//! budget, fairly across processes, and recovers bloat under memory
//! pressure ([`agent`]); and pre-zeroed huge pages for a process's own
//! growing memory ([`prezero`]). The cost of a page walk it ranks by is a
//! mechanism ([`pagewise_mech::walk_cost`]).

#![forbid(unsafe_code)]

#[macro_use]
extern crate pagewise_mech;

pub mod agent;
pub mod prezero;

pub use pagewise_mech::walk_cost::{calibrate_walk_cost, WalkCost};
