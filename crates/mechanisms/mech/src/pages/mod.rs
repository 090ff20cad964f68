//! Mechanisms that act on pages: ranges of them, their page tables
//! walked, their writes tracked and their faults served, their contents
//! hashed, and owned memory to test them on.

pub mod access;
pub mod anon;
pub mod bloom;
pub mod fault;
pub mod hash;
pub mod region;
pub mod walk;
pub mod walk_cost;
pub mod workload;
pub mod wp;
