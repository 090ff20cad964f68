//! `pagewise inspect` end to end on a real process (the exact counts are
//! checked against a known layout in the library's tests).

use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_pagewise");

#[test]
fn inspect_json_has_the_summary() {
    if !pagewise::probe::get().pagemap_scan {
        eprintln!("skipped: no PAGEMAP_SCAN");
        return;
    }
    // This test process itself, with 8 MiB of one repeated page.
    let keep = pagewise::workload::AnonMemory::new(2048 * 4096).unwrap();
    for p in 0..2048 {
        keep.fill_page(p, 7);
    }
    let me = std::process::id().to_string();
    let out = Command::new(BIN)
        .args(["inspect", "--pid", &me, "--json", "--regions"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for k in [
        "rss_bytes",
        "thp_bytes",
        "bloat_bytes",
        "zero_bytes",
        "duplicate_bytes",
    ] {
        assert!(v[k].is_u64(), "no {k} in {v}");
    }
    let g = |k: &str| v[k].as_u64().unwrap();
    assert!(g("rss_bytes") >= g("anon_bytes") && g("anon_bytes") >= g("zero_bytes"));
    assert!(g("thp_bytes") <= g("anon_bytes") && g("bloat_bytes") <= g("thp_bytes"));
    // 2048 identical pages free at least 2047 pages when merged.
    assert!(
        g("duplicate_bytes") >= 2047 * 4096,
        "{}",
        g("duplicate_bytes")
    );
    assert!(!v["regions"].as_array().unwrap().is_empty());
    // This process is not KSM-mergeable: KSM merges none of it.
    if std::path::Path::new("/proc/self/ksm_stat").exists() {
        assert_eq!(v["ksm_merging_bytes"], 0);
    }
    drop(keep);

    let bad = Command::new(BIN)
        .args(["inspect", "--pid", "999999999"])
        .output()
        .unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no process"));
}
