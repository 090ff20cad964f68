//! libFuzzer's entry to the target `track-protocol` (`crates/beside/fuzz/src/targets/track_protocol.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("track-protocol");
