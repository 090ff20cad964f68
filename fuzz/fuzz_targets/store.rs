//! libFuzzer's entry to the target `store` (`crates/beside/fuzz/src/targets/store.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("store");
