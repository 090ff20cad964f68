//! libFuzzer's entry to the target `uffd-maker` (`crates/beside/fuzz/src/targets/uffd_maker.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("uffd-maker");
