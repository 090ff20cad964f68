//! The shared library carries a soname, so that programs linked against
//! it find `libpagewise.so.0` once installed (see the Makefile).

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").unwrap_or_else(|_| "0".into());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libpagewise.so.{major}");
}
