//! What pagewise's tests share.
//!
//! A test whose kernel feature (or tool, or privilege) is missing does not
//! pass silently: it reports `SKIP <test>: <reason>` straight to the
//! process's standard error, which `cargo test` shows even for a test that
//! passes (it captures only what the print macros write), and returns.

/// Reports that the calling test skips (part of) what it is named after,
/// and why. The test's name is its thread's, as the test harness names it.
pub fn report_skip(why: &str) {
    let name = std::thread::current()
        .name()
        .unwrap_or("a test")
        .to_string();
    let line = format!("SKIP {name}: {why}\n");
    // Straight to the file descriptor: the harness captures the print
    // macros' output of passing tests, and a skip must be seen.
    // SAFETY: write(2) of a valid buffer to standard error.
    unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// `skip!("reason {x}")`: [`report_skip`] with a formatted reason.
#[macro_export]
macro_rules! skip {
    ($($t:tt)*) => {
        $crate::report_skip(&format!($($t)*))
    };
}
