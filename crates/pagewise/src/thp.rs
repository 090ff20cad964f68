//! Huge-page policy (HawkEye): bloat, access coverage and promotion by benefit.
//! Not yet implemented.
