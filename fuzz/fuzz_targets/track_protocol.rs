//! libFuzzer's entry to the target `track-protocol` (`crates/fuzz/src/targets/track_protocol.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("track-protocol");
