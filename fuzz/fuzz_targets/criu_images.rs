//! libFuzzer's entry to the target `criu-images` (`crates/beside/fuzz/src/targets/criu_images.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("criu-images");
