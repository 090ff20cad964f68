//! libFuzzer's entry to the target `seccomp-filter` (`crates/beside/fuzz/src/targets/seccomp_filter.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("seccomp-filter");
