//! libFuzzer's entry to the target `wire` (`crates/beside/fuzz/src/targets/wire.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("wire");
