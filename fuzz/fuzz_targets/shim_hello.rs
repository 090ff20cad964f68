//! libFuzzer's entry to the target `shim-hello` (`crates/beside/fuzz/src/targets/shim_hello.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("shim-hello");
