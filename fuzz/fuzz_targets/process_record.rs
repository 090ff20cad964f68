//! libFuzzer's entry to the target `process-record` (`crates/beside/fuzz/src/targets/process_record.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("process-record");
