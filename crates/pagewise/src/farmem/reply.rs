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
}
/// The caller's end.
pub struct Rx<T> {
    slot: Arc<Mutex<Option<T>>>,
    pipe: std::io::PipeReader,
}

/// A new channel for one answer.
pub fn channel<T>() -> Result<(Tx<T>, Rx<T>)> {
    let (r, w) = std::io::pipe().map_err(|e| Error::os("creating a reply pipe", e))?;
    let slot = Arc::new(Mutex::new(None));
    Ok((
        Tx {
            slot: slot.clone(),
            pipe: w,
        },
        Rx { slot, pipe: r },
    ))
}

impl<T> Tx<T> {
    /// Sends the answer; fails only when the caller is gone.
    pub fn send(mut self, v: T) -> std::result::Result<(), ()> {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(v);
        self.pipe.write_all(b"r").map_err(|_| ())
    }
}

impl<T> Rx<T> {
    /// Waits for the answer; `Err` when the sender went away without one.
    pub fn recv(mut self) -> std::result::Result<T, ()> {
        let mut b = [0u8; 1];
        let _ = self.pipe.read(&mut b);
        self.slot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or(())
    }
}
