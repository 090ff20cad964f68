//! libFuzzer's entry to the target `criu-page-server` (`crates/beside/fuzz/src/targets/criu_page_server.rs`).
#![no_main]
pagewise_fuzz::libfuzzer_main!("criu-page-server");
