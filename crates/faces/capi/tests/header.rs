//! `include/pagewise.h` must be what cbindgen makes of the current source.

use std::path::Path;

#[test]
fn header_is_current() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config =
        cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .expect("cbindgen parses src/lib.rs");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = crate_dir.join("../../../include/pagewise.h");
    if std::env::var_os("PAGEWISE_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &fresh).unwrap();
        eprintln!("wrote {}", path.display());
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/pagewise.h is stale (or missing): regenerate it with\n  \
         PAGEWISE_BLESS=1 cargo test -p pagewise-capi --test header"
    );
}
