//! An installed tree (`make install-files PREFIX=...` from the built
//! workspace) works on its own: the tool run from another directory finds
//! the shim installed beside it (not the source tree's) and tracks a
//! program through it; `pagewise bench` finds its program; the man pages
//! are where `man` looks; the bash completion loads; `pkg-config` gives
//! the flags a C program links with against the installed library.

mod support;
use support::*;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// Runs `c`, which must succeed; its standard output.
fn run(c: &mut Command) -> String {
    String::from_utf8_lossy(&ok(c).stdout).into_owned()
}

#[test]
fn an_installed_tree_works_on_its_own() {
    for tool in ["make", "cc", "pkg-config", "bash", "gzip"] {
        if which(tool).is_none() {
            pagewise_testkit::skip!("install: {tool} is not installed here");
            return;
        }
    }
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_pagewise"));
    let built = bin.parent().expect("a directory").to_path_buf();
    let missing: Vec<&str> = ["pagewise-bench", "libpagewise.so"]
        .into_iter()
        .filter(|f| !built.join(f).exists())
        .collect();
    if !missing.is_empty() {
        pagewise_testkit::not_happened!(
            "install: {missing:?} not built in {} (cargo build --release --workspace first)",
            built.display()
        );
        return;
    }
    if let Err(why) = pagewise_testkit::ensure_preload_shim(env!("CARGO_BIN_EXE_pagewise")) {
        pagewise_testkit::not_happened!("install: no preload shim: {why}");
        return;
    }
    let prefix =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&prefix);
    run(Command::new("make")
        .arg("-C")
        .arg(workspace())
        .arg("-s")
        .arg("install-files")
        .arg(format!("PREFIX={}", prefix.display()))
        .arg(format!("TARGET={}", built.display())));
    let elsewhere = std::env::temp_dir();
    let tool = prefix.join("bin/pagewise");

    // The shim installed beside the tool, not the one of the source tree.
    let probe = run(Command::new(&tool).arg("probe").current_dir(&elsewhere));
    let shim_line = probe
        .lines()
        .find(|l| l.starts_with("preload shim"))
        .expect("probe names the preload shim");
    let installed_shim = prefix.join("lib/pagewise/libpagewise_preload.so");
    let said = shim_line.trim_start_matches("preload shim").trim();
    assert_eq!(
        std::fs::canonicalize(said).ok(),
        std::fs::canonicalize(&installed_shim).ok(),
        "the installed tool uses the installed shim: {shim_line}"
    );
    // ... and runs a program through it.
    let out = run(Command::new(&tool)
        .args([
            "track",
            "--json",
            "--interval-ms",
            "50",
            "--",
            "sleep",
            "0.3",
        ])
        .current_dir(&elsewhere));
    assert!(
        out.lines().any(|l| l.contains("\"dirty_pages\"")),
        "track through the installed shim reports: {out}"
    );

    // `pagewise bench` finds the installed pagewise-bench.
    let help = run(Command::new(&tool)
        .args(["bench", "--help"])
        .current_dir(&elsewhere));
    assert!(help.contains("rollback"), "pagewise bench --help: {help}");

    // Man pages where `man` looks under the prefix.
    let man1 = prefix.join("share/man/man1");
    for page in [
        "pagewise.1.gz",
        "pagewise-track.1.gz",
        "pagewise-snapshot-restore.1.gz",
    ] {
        assert!(man1.join(page).exists(), "{page} installed");
    }
    if which("man").is_some() {
        let path = run(Command::new("man")
            .args(["-w", "pagewise-track"])
            .env("MANPATH", prefix.join("share/man")));
        assert!(
            path.trim().ends_with("pagewise-track.1.gz"),
            "man -w: {path}"
        );
    } else {
        pagewise_testkit::skip!("install: man is not installed here (the pages are)");
    }

    // The bash completion loads and completes the commands.
    let comp = prefix.join("share/bash-completion/completions/pagewise");
    let words = run(Command::new("bash").arg("-c").arg(format!(
        "source {}; COMP_WORDS=(pagewise sn); COMP_CWORD=1; COMP_LINE='pagewise sn'; \
         COMP_POINT=11; _pagewise pagewise sn pagewise; echo \"${{COMPREPLY[@]}}\"",
        comp.display()
    )));
    assert!(
        words.split_whitespace().any(|w| w == "snapshot"),
        "completions of 'sn': {words}"
    );

    // A C program built with pkg-config's flags against the installed library.
    let pc = prefix.join("lib/pkgconfig");
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "pagewise"])
        .env("PKG_CONFIG_PATH", &pc));
    assert!(flags.contains("-lpagewise"), "pkg-config: {flags}");
    let src = prefix.join("version.c");
    std::fs::write(
        &src,
        "#include <stdio.h>\n#include <pagewise.h>\nint main(void) { puts(pw_version()); return 0; }\n",
    )
    .unwrap();
    let exe = prefix.join("version");
    run(Command::new("cc")
        .arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(flags.split_whitespace()));
    let v = run(Command::new(&exe).env("LD_LIBRARY_PATH", prefix.join("lib")));
    assert_eq!(
        v.trim(),
        env!("CARGO_PKG_VERSION"),
        "the installed library's version"
    );
    let needed = run(Command::new("readelf").arg("-d").arg(&exe));
    assert!(
        needed.contains("libpagewise.so.0"),
        "linked against the soname: {needed}"
    );
    let _ = std::fs::remove_dir_all(&prefix);
}
