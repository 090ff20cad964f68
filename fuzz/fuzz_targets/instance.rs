//! libFuzzer's entry to the target `instance` (`crates/beside/fuzz/src/targets/instance.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("instance");
