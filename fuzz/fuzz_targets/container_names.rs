//! libFuzzer's entry to the target `container-names` (`crates/beside/fuzz/src/targets/container_names.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("container-names");
