//! How every long-running command ends on SIGINT or SIGTERM
//! (`pagewise::agent::StopSignals`, whose docs say how), and how a
//! command started with `-- CMD` runs beside its output: with `--json`,
//! pagewise's JSON is alone on its standard output and the program's
//! standard output goes to pagewise's standard error ([`program_output`]),
//! so `pagewise … --json -- CMD | jq` reads JSON only, and the program's
//! output is still seen.

use std::process::{Command, Stdio};

pub use pagewise::agent::stop::{StopSignals as Stop, GRACE};

/// With `--json`, sends the standard output of a program started with
/// `-- CMD` to pagewise's standard error. (A command that starts one
/// plainly ties it with [`pagewise::agent::child::tie`]; programs started
/// under the shim are tied by the library.)
pub fn program_output(c: &mut Command, json: bool) {
    if json {
        use std::os::fd::AsFd;
        if let Ok(err) = std::io::stderr().as_fd().try_clone_to_owned() {
            c.stdout(Stdio::from(err));
        }
    }
}
