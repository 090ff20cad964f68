//! How a tool's run ends on SIGINT or SIGTERM ([`StopSignals`]), with
//! the program it started (the book's "Command-line conventions" say the
//! same to users):
//!
//! - the signal is caught ([`StopSignals::take`]); the run finishes the
//!   step it is in, writes its summary as at a normal end, puts back every
//!   setting it changed, and exits with 128 + the signal (130 for SIGINT,
//!   143 for SIGTERM: [`StopSignals::status`]);
//! - a program it started is ended first ([`StopSignals::wait`]): SIGTERM
//!   is passed on at once; SIGINT after a second, since a terminal's
//!   Ctrl-C reached the program already (it is in the same process
//!   group), and a second SIGINT could cut its own clean-up short. The
//!   program has [`GRACE`] to end, then it is killed; it is always waited
//!   for;
//! - the program is tied to its starter ([`crate::child::tie`], which
//!   every program started under the shim gets): if the starter is killed
//!   outright (SIGKILL), the program gets SIGTERM.
//!
//! A run that holds no [`StopSignals`] may say what SIGINT and SIGTERM do
//! instead ([`on_stop_otherwise`]: put back what it changed and exit).

pub use pagewise_sys::signal::{default_sigpipe, on_stop_otherwise};

use pagewise_mech::child;
use pagewise_mech::{Error, Result};
use pagewise_sys::signal::StopFlag;
use std::process::{Child, ExitStatus};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a program has to end after the signal is passed on.
pub const GRACE: Duration = Duration::from_secs(5);
/// How long a program has to end on a terminal's SIGINT before it is
/// passed on.
const OWN_SIGINT: Duration = Duration::from_secs(1);

/// SIGINT and SIGTERM, caught for the whole run; the loop's
/// [`Interrupt`](crate::Interrupt) for a tool.
#[allow(missing_debug_implementations)]
pub struct StopSignals(StopFlag);

impl StopSignals {
    /// Catches SIGINT and SIGTERM from now on.
    pub fn take() -> Result<StopSignals> {
        pagewise_sys::signal::stop_flag()
            .map(StopSignals)
            .map_err(|e| Error::os("catching SIGINT and SIGTERM", e))
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
            let exited = child
                .try_wait()
                .map_err(|e| Error::os("waiting for the program", e))?;
            if let Some(st) = exited {
                return Ok(st);
            }
            if self.requested() {
                return Ok(self.end(child));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Ends `child` after a stop: the signal passed on (SIGINT after
    /// a second), [`GRACE`] to end, then killed; reaped either way.
    pub fn end(&self, child: &mut Child) -> ExitStatus {
        let sig = self.0.signal().unwrap_or(libc::SIGTERM);
        if sig == libc::SIGINT {
            if let Some(st) = child::wait_for(child, OWN_SIGINT) {
                return st;
            }
        }
        child::signal_then_kill(child, sig, GRACE)
    }

    /// The exit status of a run that started a program: 128 + the signal
    /// after a stop, else the program's own (as `time` and `strace` do).
    pub fn exit_code(&self, st: ExitStatus) -> i32 {
        self.status().unwrap_or_else(|| child::exit_code(st))
    }
}

impl crate::Interrupt for StopSignals {
    fn requested(&self) -> bool {
        StopSignals::requested(self)
    }
    fn sleep(&self, d: Duration) -> bool {
        StopSignals::sleep(self, d)
    }
}
