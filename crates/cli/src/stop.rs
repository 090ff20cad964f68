//! How every long-running command ends on SIGINT or SIGTERM, and how a
//! command started with `-- CMD` runs beside its output (the book's
//! "Command-line conventions" say the same to users):
//!
//! - the signal is caught ([`Stop::take`]); the command finishes the step it
//!   is in, writes its summary and its `--json`/`--stats-json` as at a
//!   normal end, puts back every setting it changed, and exits with
//!   128 + the signal (130 for SIGINT, 143 for SIGTERM);
//! - a program it started is ended first ([`Stop::wait`]): SIGTERM is
//!   passed on at once; SIGINT after a second, since a terminal's Ctrl-C
//!   reached the program already (it is in the same process group), and
//!   a second SIGINT could cut its own clean-up short. The program has
//!   5 s to end, then it is killed; it is always waited for;
//! - the program is tied to pagewise ([`pagewise::agent::child::tie`], which
//!   every program started under the shim gets): if pagewise is killed
//!   outright (SIGKILL), the program gets SIGTERM;
//! - with `--json`, pagewise's JSON is alone on its standard output and the
//!   program's standard output goes to pagewise's standard error
//!   ([`program_output`]), so `pagewise … --json -- CMD | jq` reads JSON
//!   only, and the program's output is still seen.

use anyhow::Result;
use pagewise::agent::child;
use pagewise_sys::signal::StopFlag;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a program has to end after the signal is passed on.
pub const GRACE: Duration = Duration::from_secs(5);
/// How long a program has to end on a terminal's SIGINT before it is
/// passed on.
const OWN_SIGINT: Duration = Duration::from_secs(1);

/// SIGINT and SIGTERM, caught for the whole command.
pub struct Stop(StopFlag);

impl Stop {
    /// Catches SIGINT and SIGTERM from now on.
    pub fn take() -> Result<Stop> {
        Ok(Stop(pagewise_sys::signal::stop_flag()?))
    }

    /// A SIGINT or SIGTERM came.
    pub fn requested(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// The exit status the convention gives after a stop: 128 + the signal.
    pub fn status(&self) -> Option<i32> {
        self.0.signal().map(|s| 128 + s)
    }

    /// Sleeps for `d`, or less if a stop comes; whether one came.
    pub fn sleep(&self, d: Duration) -> bool {
        self.0.sleep(d)
    }

    /// Waits for `child` to end; on a stop, ends it as the module docs say.
    pub fn wait(&self, child: &mut Child) -> Result<ExitStatus> {
        loop {
            if let Some(st) = child.try_wait()? {
                return Ok(st);
            }
            if self.requested() {
                return Ok(self.end(child));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends `child` after a stop: the signal passed on (SIGINT after
    /// [`OWN_SIGINT`]), [`GRACE`] to end, then killed; reaped either way.
    pub fn end(&self, child: &mut Child) -> ExitStatus {
        let sig = self.0.signal().unwrap_or(libc::SIGTERM);
        if sig == libc::SIGINT {
            if let Some(st) = child::wait_for(child, OWN_SIGINT) {
                return st;
            }
        }
        child::signal_then_kill(child, sig, GRACE)
    }

    /// The exit status of a command that ran a program: 128 + the signal
    /// after a stop, else the program's own (as `time` and `strace` do).
    pub fn exit_code(&self, st: ExitStatus) -> i32 {
        self.status().unwrap_or_else(|| child::exit_code(st))
    }
}

/// With `--json`, sends the standard output of a program started with
/// `-- CMD` to pagewise's standard error. (Programs started under the shim
/// are tied by [`pagewise::shim::shim_command`]; a command that
/// starts one plainly ties it with [`pagewise::agent::child::tie`].)
pub fn program_output(c: &mut Command, json: bool) {
    if json {
        use std::os::fd::AsFd;
        if let Ok(err) = std::io::stderr().as_fd().try_clone_to_owned() {
            c.stdout(Stdio::from(err));
        }
    }
}
