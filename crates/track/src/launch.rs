//! Starting a program with the preload shim tracking its writes from inside
//! (the other end of [`super::protocol`]).

use super::{protocol, BackendKind};
use pagewise_mech::child::wait_for;
use pagewise_mech::shim::{spawn_with_socket, ShimRequest};
use pagewise_mech::{Error, Result};
use std::os::unix::net::UnixStream;
use std::process::{Child, Command, ExitStatus};
use std::time::Duration;

/// A program started with the shim tracking its writes (see [`start_tracked`]).
#[non_exhaustive]
pub enum Tracked {
    /// Running, the shim answered: the socket to send requests on and the
    /// backend the shim uses.
    Running(Child, UnixStream, BackendKind),
    /// It ended before the shim could answer: its status.
    Over(ExitStatus),
    /// It runs, but its shim did not answer: a wrapper that replaced itself
    /// with `exec` (the program it started runs under the same pid,
    /// without the shim's socket), or a program that ignores
    /// `LD_PRELOAD`. The caller may watch it from outside, or stop it.
    Silent(Child, Error),
}

/// Starts `cmd` with the shim preloaded and tracking its writes with
/// `backend` (the command set up further by `setup`: its standard streams,
/// say), and waits (10 s at most) for the shim's hello.
pub fn start_tracked(
    cmd: &[String],
    backend: BackendKind,
    setup: impl FnOnce(&mut Command),
) -> Result<Tracked> {
    let (mut child, mut s) = spawn_with_socket(
        cmd,
        |fd| ShimRequest {
            track: Some((fd, backend.name().into())),
            ..ShimRequest::default()
        },
        setup,
    )?;
    let program = &cmd[0];
    let hello = s
        .set_read_timeout(Some(Duration::from_secs(10)))
        .and_then(|_| protocol::hello(&mut s));
    match hello {
        Ok(got) => {
            s.set_read_timeout(Some(Duration::from_secs(60)))
                .map_err(|e| Error::os("setting the shim socket's timeout", e))?;
            Ok(Tracked::Running(child, s, got))
        }
        // Over before the shim could answer: its status is the answer.
        Err(_) if let Some(st) = wait_for(&mut child, Duration::from_millis(500)) => {
            Ok(Tracked::Over(st))
        }
        Err(e) => Ok(Tracked::Silent(
            child,
            Error::ShimSilent {
                program: program.clone(),
                source: e,
            },
        )),
    }
}
