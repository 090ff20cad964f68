//! Starting a program with the preload shim tracking its writes from inside
//! (the other end of [`super::protocol`]).

use super::{protocol, BackendKind};
use crate::{Error, Result};
use pagewise_mech::child::wait_for;
use pagewise_mech::shim::{ask, env, parsed, parsed_fd, spawn_with_socket, Request};
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

/// The shim is asked to track the program's writes with `backend`,
/// serving [`protocol`] on the socket at descriptor `fd`
/// ([`env::TRACK_FD`], [`env::TRACK_BACKEND`]).
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct TrackRequest {
    /// The shim's end of the socketpair.
    pub fd: i32,
    /// The backend the shim tracks with.
    pub backend: BackendKind,
}

impl Request for TrackRequest {
    const KEY: &'static str = env::TRACK_FD;
    const VARS: &'static [&'static str] = &[env::TRACK_FD, env::TRACK_BACKEND];
    const INHERITED: bool = false;
    fn encode(&self, set: &mut dyn FnMut(&'static str, String)) {
        set(env::TRACK_FD, self.fd.to_string());
        set(env::TRACK_BACKEND, self.backend.name().into());
    }
    fn decode(
        get: &dyn Fn(&'static str) -> Option<String>,
    ) -> std::result::Result<Option<Self>, String> {
        let Some(fd) = parsed_fd(get, env::TRACK_FD)? else {
            return Ok(None);
        };
        let backend = parsed(get, env::TRACK_BACKEND)?.unwrap_or(BackendKind::UffdWp);
        Ok(Some(TrackRequest { fd, backend }))
    }
}

/// Starts `cmd` with the shim preloaded and tracking its writes with
/// `backend` (the command set up further by `setup`: its standard streams,
/// say), and waits (10 s at most) for the shim's hello.
pub fn start_tracked(
    cmd: &[String],
    backend: BackendKind,
    setup: impl FnOnce(&mut Command),
) -> Result<Tracked> {
    let (mut child, mut s) =
        spawn_with_socket(cmd, |c, fd| ask(c, &TrackRequest { fd, backend }), setup)?;
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
            pagewise_mech::Error::ShimSilent {
                program: program.clone(),
                source: e,
            }
            .into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracking_request_goes_through_its_variables_unchanged() {
        let asked = TrackRequest {
            fd: 7,
            backend: BackendKind::Mprotect,
        };
        assert_eq!(pagewise_mech::shim::round_trip(&asked), Ok(Some(asked)));
        let bad = |k: &'static str| match k {
            env::TRACK_FD => Some("7".to_string()),
            env::TRACK_BACKEND => Some("carbon-paper".to_string()),
            _ => None,
        };
        let e = TrackRequest::decode(&bad).unwrap_err();
        assert!(
            e.starts_with("PAGEWISE_TRACK_BACKEND=\"carbon-paper\""),
            "{e}"
        );
    }
}
