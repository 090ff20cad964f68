//! The C API's records mirror the library's: each `pw_*` struct of
//! `include/pagewise.h` (generated from this crate by cbindgen and checked
//! by `header.rs`) has the fields of the library record it is written from,
//! as that record serialises them, save those said here with why. A field
//! added to a library record, renamed or dropped fails this test until the
//! C record follows or the difference is said.

use serde_json::Value;
use std::collections::BTreeSet;

/// The fields of `typedef struct NAME { ... } NAME;` in the header.
fn c_fields(header: &str, name: &str) -> BTreeSet<String> {
    let open = format!("typedef struct {name} {{");
    let start = header
        .find(&open)
        .unwrap_or_else(|| panic!("{name} is not in include/pagewise.h"));
    let body = &header[start + open.len()..];
    let body = &body[..body.find(&format!("}} {name};")).expect("the struct's end")];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && l.ends_with(';'))
        .map(|l| {
            let decl = l.trim_end_matches(';');
            let decl = decl.split('[').next().unwrap_or(decl);
            decl.rsplit([' ', '*']).next().unwrap_or(decl).to_string()
        })
        .collect()
}

/// The fields of a library record as it serialises, those of the nested
/// records named in `flatten` taken as its own (the C record flattens
/// them).
fn lib_fields(v: &Value, flatten: &[&str]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (k, x) in v.as_object().expect("a record serialises as an object") {
        match x {
            Value::Object(_) if flatten.contains(&k.as_str()) => out.extend(lib_fields(x, &[])),
            _ => {
                out.insert(k.clone());
            }
        }
    }
    out
}

/// One C record and the library record it is written from.
struct Mirror {
    c: &'static str,
    lib: Value,
    /// Nested library records the C record flattens.
    flatten: &'static [&'static str],
    /// Fields of the C record only, each with why.
    c_only: &'static [(&'static str, &'static str)],
    /// Fields of the library record not in C, each with why.
    lib_only: &'static [(&'static str, &'static str)],
}

macro_rules! json {
    ($v:expr) => {
        serde_json::to_value($v).expect("serialises")
    };
}

#[test]
fn every_c_record_has_the_fields_of_its_library_record() {
    let header = include_str!("../../../../include/pagewise.h");
    let mirrors = [
        Mirror {
            c: "pw_collect_stats",
            lib: json!(pw::track::CollectStats::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[],
        },
        Mirror {
            c: "pw_store_stats",
            lib: json!(pw::snap::StoreStats::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[],
        },
        Mirror {
            c: "pw_snapshot_info",
            lib: json!(pw::snap::SnapshotInfo::default()),
            flatten: &["take"],
            c_only: &[],
            lib_only: &[],
        },
        Mirror {
            c: "pw_restore_stats",
            lib: json!(pw::snap::RestoreStats::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[(
                "pages_compared",
                "0 for the calling process's own regions, which are tracked; and a record grown would break callers built against an earlier header",
            )],
        },
        Mirror {
            c: "pw_save_stats",
            lib: json!(pw::snap::SaveStats::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[],
        },
        Mirror {
            c: "pw_disk_stats",
            lib: json!(pw::snap::DiskStats::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[],
        },
        Mirror {
            c: "pw_lazy_stats",
            lib: json!(pw::snap::LazyStats::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[],
        },
        Mirror {
            c: "pw_process_restore_stats",
            lib: json!(pw::snap::RestoreReport::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[
                (
                    "fds",
                    "what was done with each descriptor: a list, in the JSON of `snapshot restore`",
                ),
                (
                    "compared",
                    "how pages were compared: said by the tool, not needed by a C caller",
                ),
                ("phases", "the time of each phase: for the benchmarks"),
                (
                    "pages_compared",
                    "how much a restore read to compare: for the tool's JSON; a record grown would break callers built against an earlier header",
                ),
                (
                    "thread_areas",
                    "a list of address ranges; the C record gives counts",
                ),
            ],
        },
        Mirror {
            c: "pw_live_report",
            lib: json!(pw::snap::live::LiveReport::default()),
            flatten: &[],
            c_only: &[],
            lib_only: &[
                (
                    "copy_rate_bps",
                    "a rate the caller computes from bytes_copied and copy_ms",
                ),
                (
                    "dirty_rate_bps",
                    "the pages written per second during the passes: for the tool's report",
                ),
            ],
        },
    ];
    let mut wrong = Vec::new();
    for m in &mirrors {
        let c = c_fields(header, m.c);
        let lib = lib_fields(&m.lib, m.flatten);
        for (f, _) in m.c_only {
            assert!(
                c.contains(*f),
                "{}: said C-only field {f} is not in it",
                m.c
            );
        }
        for (f, _) in m.lib_only {
            assert!(
                lib.contains(*f),
                "{}: said library-only field {f} is not in the library's record",
                m.c
            );
        }
        let c_rest: BTreeSet<_> = c
            .iter()
            .filter(|f| !m.c_only.iter().any(|(x, _)| x == f))
            .collect();
        let lib_rest: BTreeSet<_> = lib
            .iter()
            .filter(|f| !m.lib_only.iter().any(|(x, _)| x == f))
            .collect();
        if c_rest != lib_rest {
            wrong.push(format!(
                "{}: C only {:?}, library only {:?}",
                m.c,
                c_rest.difference(&lib_rest).collect::<Vec<_>>(),
                lib_rest.difference(&c_rest).collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "records that differ:\n{}",
        wrong.join("\n")
    );
    println!(
        "ok   {} C records have the fields of their library records",
        mirrors.len()
    );
}
