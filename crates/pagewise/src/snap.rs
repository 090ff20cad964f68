//! Same-page-merging snapshots (SimGrid): a content-addressed page store and
//! incremental snapshots built on [`crate::track`]. Not yet implemented.
