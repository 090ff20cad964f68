//! `pagewise inspect` end to end on a real process (the exact counts are
//! checked against a known layout in the library's tests).

mod support;
use support::*;

#[test]
fn inspect_json_has_the_summary() {
    if !pagewise::probe::get().pagemap_scan {
        pagewise_testkit::skip!("no PAGEMAP_SCAN");
        return;
    }
    // This test process itself, with 8 MiB of one repeated page.
    let keep = pagewise::workload::AnonMemory::new(2048 * 4096).unwrap();
    for p in 0..2048 {
        keep.fill_page(p, 7);
    }
    let me = std::process::id().to_string();
    let out = ok(Command::new(BIN).args(["inspect", "--pid", &me, "--json", "--regions"]));
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

/// Whether `inspect -- CMD` can run here (the far-memory shim's needs);
/// the test skipped, with the reason, where not.
fn can_start_commands() -> bool {
    let p = pagewise::probe::get();
    if !p.pagemap_scan
        || !p.uffd_has(pagewise_sys::uffd::feature::MOVE)
        || !cfg!(target_arch = "x86_64")
    {
        pagewise_testkit::skip!("needs PAGEMAP_SCAN, UFFDIO_MOVE and the x86-64 shim");
        return false;
    }
    if let Err(why) = pagewise_testkit::ensure_preload_shim(env!("CARGO_BIN_EXE_pagewise")) {
        pagewise_testkit::skip!("{why}");
        return false;
    }
    true
}

/// `pagewise inspect --coverage -- CMD` on the known layout
/// (`pagewise workload --layout`): zero, duplicate, huge and bloat pages of
/// its memory exactly, and access coverage exactly too: all 512 pages of
/// every hot region touched, none of a cold one.
#[test]
fn command_under_inspect_matches_its_layout() {
    if !can_start_commands() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pw-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let truth_path = dir.join("truth.json");
    let svg = dir.join("map.svg");
    let out = ok(Command::new(BIN)
        .args(["inspect", "--json", "--regions", "--coverage", "1500"])
        // Once the layout is built (it writes the truth then), not after
        // a time a busy machine may not keep to.
        .args(["--after", "60000", "--ready-file"])
        .arg(&truth_path)
        .arg("--heatmap")
        .arg(&svg)
        .args(["--", BIN, "workload", "--layout", "32", "--seconds", "60"])
        .arg("--truth")
        .arg(&truth_path)
        .env("PAGEWISE_FARMEM_DIR", &dir));
    let t: pagewise::workload::LayoutTruth =
        serde_json::from_slice(&std::fs::read(&truth_path).unwrap()).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let regions: Vec<&serde_json::Value> = v["regions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| {
            let s = r["start"].as_u64().unwrap();
            s >= t.addr && s < t.addr + t.len
        })
        .collect();
    assert_eq!(regions.len(), 32, "one report per 2 MiB region");
    let sum = |k: &str| regions.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
    assert_eq!(sum("resident_pages"), t.pages);
    assert_eq!(sum("zero_pages"), t.zero_pages);
    assert_eq!(sum("duplicate_pages"), t.duplicate_pages);
    if t.collapsed {
        assert_eq!(sum("huge_pages"), t.pages);
        assert_eq!(sum("bloat_pages"), t.zero_pages);
    } else {
        pagewise_testkit::claim_not_happened!(
            "madv_collapse",
            "huge-page part: the layout could not be collapsed"
        );
    }
    assert_eq!(v["coverage"]["method"], "sampler", "{}", v["coverage"]);
    for r in &regions {
        let s = r["start"].as_u64().unwrap();
        let touched = r["touched_pages"].as_u64().unwrap();
        if t.hot.contains(&s) {
            assert_eq!(touched, 512, "hot region {s:#x}");
            assert!(r["access_rate"].as_f64().unwrap() > 0.0);
        } else {
            assert_eq!(touched, 0, "cold region {s:#x}");
        }
    }
    // The hottest list holds hot regions only.
    let hottest = v["hottest"].as_array().unwrap();
    assert!(!hottest.is_empty());
    for h in hottest {
        let s = h["start"].as_u64().unwrap();
        assert!(
            t.hot.contains(&s) || s < t.addr || s >= t.addr + t.len,
            "{h}"
        );
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.matches("<rect").count() > 32);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A command that does not make its ready file in time is one clear
/// error, naming the file and the wait.
#[test]
fn a_ready_file_not_made_in_time_is_an_error() {
    if !can_start_commands() {
        return;
    }
    let dir = temp_dir("inspect-ready");
    let never = dir.join("never");
    let out = Command::new(BIN)
        .args(["inspect", "--after-ms", "300", "--ready-file"])
        .arg(&never)
        .args(["--", "sleep", "30"])
        .env("PAGEWISE_FARMEM_DIR", &dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("did not make") && err.contains("within 300 ms"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Without idle page tracking, coverage of a process not started under
/// pagewise is refused with the reason, not guessed.
#[test]
fn coverage_unavailable_says_why() {
    if !pagewise::probe::get().pagemap_scan {
        pagewise_testkit::skip!("no PAGEMAP_SCAN");
        return;
    }
    if pagewise::access::idle_page_unavailable().is_none() {
        pagewise_testkit::skip!("this kernel has idle page tracking");
        return;
    }
    let me = std::process::id().to_string();
    let out = Command::new(BIN)
        .args(["inspect", "--pid", &me, "--json", "--coverage", "100"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["coverage"]["method"].is_null());
    let why = v["coverage"]["unavailable"].as_str().unwrap();
    assert!(why.contains("idle page tracking"), "{why}");
}

/// `inspect -- CMD` as a user who cannot open a full userfaultfd says so
/// up front (exit 3, with the setting that decides it), not that the
/// command exited.
#[test]
fn inspect_command_without_userfaultfd_says_why() {
    let (Some(mut nobody), true) = (as_nobody(), unprivileged_userfaultfd_off()) else {
        pagewise_testkit::skip!(
            "inspect -- CMD as another user: needs root, setpriv and vm.unprivileged_userfaultfd=0"
        );
        return;
    };
    let out = nobody
        .args(["inspect", "--", "sleep", "2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("vm.unprivileged_userfaultfd is 0"), "{err}");
    assert!(!err.contains("exited"), "{err}");
}

/// A program that serves the faults of part of its memory itself (its own
/// userfaultfd, MISSING mode, a handler that fails it on any event but a
/// write fault): `inspect --pid` counts those mappings from the page
/// tables and never reads them, so the handler sees no event of
/// pagewise's. (The program failed 3 of 3; this one, whose
/// served pages are either resident or never touched, did not fail
/// before either: the test guards the reads that could.)
#[test]
fn inspect_never_reads_memory_a_program_serves_itself() {
    if let Some(why) = unsupported() {
        pagewise_testkit::skip!("{why}");
        return;
    }
    let mut t = pagewise_testkit::Piped::start(&mut Command::new(c_program("own_uffd")));
    assert_eq!(t.line(), "ready");
    let pid = t.pid().to_string();
    for _ in 0..3 {
        let out = Command::new(BIN)
            .args(["inspect", "--pid", &pid, "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let said = t.ask("w");
        assert!(said.starts_with("ok "), "the program's handler: {said}");
    }
}
