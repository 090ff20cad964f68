//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pagewise::track::BackendKind;

/// Runs `f` for every backend available in-process; prints skips with reasons.
pub fn for_each_backend(name: &str, skip: &[BackendKind], f: impl Fn(BackendKind)) {
    for kind in BackendKind::ALL {
        if skip.contains(&kind) {
            pagewise_testkit::skip!("[{kind}] does not apply to this backend");
            continue;
        }
        if let Err(why) = kind.available_in_process() {
            pagewise_testkit::skip!("[{kind}] {why}");
            continue;
        }
        f(kind);
        println!("ok   {name} [{kind}]");
    }
}
