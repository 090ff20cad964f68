//! Progress of long operations on stderr: an `indicatif` bar or spinner on a
//! terminal; nothing when stderr is not a terminal or with `--quiet`.

use indicatif::{ProgressBar, ProgressStyle};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static QUIET: AtomicBool = AtomicBool::new(false);

/// Silences progress for the rest of the run (`--quiet`).
pub fn set_quiet(q: bool) {
    QUIET.store(q, Ordering::Relaxed);
}

/// Whether progress is silenced.
pub fn quiet() -> bool {
    QUIET.load(Ordering::Relaxed)
}

/// A spinner showing `msg` and the time elapsed; `set_message` moves it on.
pub fn spinner(msg: impl Into<String>) -> ProgressBar {
    if quiet() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new_spinner().with_message(msg.into());
    b.set_style(
        ProgressStyle::with_template("{spinner} {elapsed:>4} {msg}").expect("a valid template"),
    );
    b.enable_steady_tick(Duration::from_millis(120));
    b
}

/// A bar of `total` steps counted in `unit`, with `msg` before it.
pub fn bar(total: u64, msg: impl Into<String>, unit: &str) -> ProgressBar {
    if quiet() {
        return ProgressBar::hidden();
    }
    let b = ProgressBar::new(total).with_message(msg.into());
    b.set_style(
        ProgressStyle::with_template(&format!(
            "{{msg}} [{{bar:30}}] {{human_pos}}/{{human_len}} {unit} ({{eta}} left)"
        ))
        .expect("a valid template")
        .progress_chars("=> "),
    );
    b
}
