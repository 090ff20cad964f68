//! `pagewise bench`: forwards to `pagewise-bench`, the benchmarks' own
//! program (the tool does not carry the experiments), found beside the
//! running `pagewise` or on the PATH.

use anyhow::{bail, Result};
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The name of the benchmarks' program.
const BENCH: &str = "pagewise-bench";

/// Replaces this process with `pagewise-bench ARGS` (`--quiet` first when
/// given); returns only if it could not be started.
pub fn run(args: Vec<String>, quiet: bool) -> Result<i32> {
    let beside = std::env::current_exe()?
        .parent()
        .map(|d| d.join(BENCH))
        .filter(|p| p.exists());
    let mut c = match &beside {
        Some(p) => Command::new(p),
        None => Command::new(BENCH),
    };
    if quiet {
        c.arg("--quiet");
    }
    c.args(&args);
    let e = c.exec();
    if e.kind() == std::io::ErrorKind::NotFound {
        bail!(
            "{BENCH} is not installed beside pagewise nor on the PATH: the benchmarks are a \
             program of their own (make bench, in the source tree)"
        );
    }
    bail!("starting {BENCH}: {e}")
}
