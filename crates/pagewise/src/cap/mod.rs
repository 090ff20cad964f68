//! The capabilities: each one system of the papers, built on the
//! mechanisms of [`crate::mech`]. They are re-exported at the crate root.

pub mod dedup;
pub mod farmem;
pub mod inspect;
pub mod snap;
pub mod thp;
pub mod track;
