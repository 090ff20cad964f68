//! One answer from the handler thread to a waiting caller, over a pipe.
//!
//! The caller may be any thread of the emulated program: it must wait
//! without anything the handler would have to touch in the program's heap
//! (a parked thread's wake-up state may sit there), so it blocks in
//! `read(2)` rather than parking.

use crate::{Error, Result};
use std::io::{Read, Write};
use std::sync::{Arc, Mutex};

/// The handler's end.
pub struct Tx<T> {
    slot: Arc<Mutex<Option<T>>>,
    pipe: std::io::PipeWriter,
    /// The pipe's read end too: a caller gone before the answer must not
    /// make the answer raise SIGPIPE.
    _reader: std::io::PipeReader,
}
/// The caller's end.
pub struct Rx<T> {
    slot: Arc<Mutex<Option<T>>>,
    pipe: std::io::PipeReader,
}

/// A new channel for one answer.
pub fn channel<T>() -> Result<(Tx<T>, Rx<T>)> {
    let (r, w) = std::io::pipe().map_err(|e| Error::os("creating a reply pipe", e))?;
    let reader = r
        .try_clone()
        .map_err(|e| Error::os("duplicating a reply pipe", e))?;
    let slot = Arc::new(Mutex::new(None));
    Ok((
        Tx {
            slot: slot.clone(),
            pipe: w,
            _reader: reader,
        },
        Rx { slot, pipe: r },
    ))
}

impl<T> Tx<T> {
    /// Sends the answer (which a caller gone meanwhile never reads).
    pub fn send(mut self, v: T) -> std::result::Result<(), ()> {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        self.pipe.write_all(b"r").map_err(|_| ())
    }
}

impl<T> Rx<T> {
    /// Waits for the answer; `Err` when the sender went away without one.
    pub fn recv(mut self) -> std::result::Result<T, ()> {
        let mut b = [0u8; 1];
        // A signal met while waiting is not the answer.
        while let Err(e) = self.pipe.read(&mut b) {
            if e.kind() != std::io::ErrorKind::Interrupted {
                break;
            }
        }
        self.slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(())
    }
}
