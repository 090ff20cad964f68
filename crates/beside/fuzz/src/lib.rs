//! The fuzz targets of pagewise: every parser of another party's bytes,
//! one file each under `targets/`, each with valid seeds built with the real
//! formats. Two drivers feed them the same way:
//!
//! - libFuzzer (`fuzz/` at the top of the tree, `cargo +nightly fuzz run
//!   TARGET`): coverage-guided, with AddressSanitizer; CI runs a bounded
//!   slice of each target (`scripts/fuzz`);
//! - `pagewise-fuzz` (this crate's binary): the same targets on the stable
//!   toolchain, for a machine without nightly, with generic mutations of the
//!   seeds and an address-space limit in place of a sanitizer.
//!
//! A target's [`Target::feed`] panics on a bug (a parser's panic, a record
//! that does not read back as written); every other outcome, a refusal
//! included, is a parser doing its work.

pub mod mutate;
pub mod targets;

pub use targets::{open, Target, NAMES};

/// The target `name` set up for a libFuzzer process: its scratch files
/// under a directory of the process's own in the temporary directory.
///
/// # Panics
/// When the target cannot be set up (no such target, no scratch space):
/// libFuzzer then stops before its first input.
pub fn libfuzzer_target(name: &str) -> Box<dyn Target> {
    let work =
        std::env::temp_dir().join(format!("pagewise-libfuzzer-{name}-{}", std::process::id()));
    match open(name, &work) {
        Ok(t) => t,
        Err(e) => panic!("fuzz target {name} cannot be set up: {e:#}"),
    }
}

/// libFuzzer's entry to the target `$name`, for a file of `fuzz/fuzz_targets/`
/// (a crate that depends on `libfuzzer-sys`): the target set up at the first
/// input, every input fed to it.
#[macro_export]
macro_rules! libfuzzer_main {
    ($name:literal) => {
        static TARGET: ::std::sync::OnceLock<Box<dyn $crate::Target>> =
            ::std::sync::OnceLock::new();
        ::libfuzzer_sys::fuzz_target!(|input: &[u8]| {
            let _ = TARGET
                .get_or_init(|| $crate::libfuzzer_target($name))
                .feed(input);
        });
    };
}
