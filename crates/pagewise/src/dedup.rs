//! Deduplication with mixed pages (SmartMD): repetition rate, access frequency
//! and split/keep decisions driving KSM. Not yet implemented.
