//! libFuzzer's entry to the target `prezero-report` (`crates/beside/fuzz/src/targets/prezero_report.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("prezero-report");
