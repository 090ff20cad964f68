//! Builds the C programs against `include/pagewise.h` and `libpagewise.so`
//! the way a C user does, runs them and checks that every check in them passed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory holding `libpagewise.so` of this profile, built now:
/// `cargo test` builds only what Rust tests link, never a cdylib.
fn lib_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(build_lib).clone()
}

fn build_lib() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>");
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "pagewise-capi", "--lib"]);
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .current_dir(root())
        .status()
        .expect("run cargo to build libpagewise.so");
    assert!(status.success(), "cargo build -p pagewise-capi failed");
    let lib = profile_dir.join("libpagewise.so");
    assert!(lib.exists(), "{} was not built", lib.display());
    profile_dir.to_path_buf()
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../..")
}

/// Compiles `source` with the documented flags (and warnings as errors) into `out`.
fn build(source: &Path, out: &Path) {
    let lib = lib_dir();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(out)
        .arg(source)
        .arg(format!("-I{}", root().join("include").display()))
        .arg(format!("-L{}", lib.display()))
        .arg("-lpagewise")
        .arg(format!("-Wl,-rpath,{}", lib.display()))
        .status()
        .unwrap_or_else(|e| panic!("running {cc}: {e} (a C compiler is needed to test the C API)"));
    assert!(status.success(), "{cc} failed on {}", source.display());
}

fn scratch(name: &str) -> PathBuf {
    let d = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("pagewise-capi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn run(exe: &Path, args: &[&Path]) -> String {
    let out = Command::new(exe)
        .args(args)
        .output()
        .expect("run the C program");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    print!("{stdout}");
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "{} failed: {:?}",
        exe.display(),
        out.status
    );
    stdout
}

#[test]
fn example_builds_and_passes() {
    let dir = scratch("example");
    let exe = dir.join("snapshot");
    build(&root().join("examples/snapshot.c"), &exe);
    let store = dir.join("store");
    let out = run(&exe, &[&store]);
    assert!(out.contains("all checks passed"), "{out}");
    assert!(!out.contains("MISMATCH"), "{out}");
    assert!(
        store.join("pages.pack").exists(),
        "the example saved into {}",
        store.display()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn api_test_passes() {
    let dir = scratch("api");
    let exe = dir.join("api_test");
    build(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/api_test.c"),
        &exe,
    );
    let out = run(&exe, &[&dir]);
    assert!(out.contains("all C API checks passed"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn header_compiles_as_cpp() {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let header = root().join("include/pagewise.h");
    match Command::new(&cxx)
        .args(["-fsyntax-only", "-Wall", "-Werror", "-x", "c++"])
        .arg(&header)
        .status()
    {
        Ok(s) => assert!(s.success(), "{cxx} rejects {}", header.display()),
        Err(e) => println!("skip: no C++ compiler ({cxx}: {e})"),
    }
}
