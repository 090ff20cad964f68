//! Dirty tracking of a buffer of this process, or of another process.

use crate::{json, os_error, ranges};
use pagewise::track::{BackendKind, DirtyTracker};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;

/// The pages of a buffer of the caller's program: its start and length,
/// page-aligned. The Python package passes them with the buffer pinned (a
/// ctypes view holds its export, so it can neither move nor be closed)
/// and keeps the pin as long as this object lives.
pub(crate) struct Held {
    pub region: pagewise::Region,
}

impl Held {
    pub fn new(address: u64, length: u64) -> PyResult<Held> {
        let region = pagewise::Region::new(address, length).map_err(|_| {
            PyValueError::new_err(format!(
                "the buffer at {address:#x}, {length} bytes, is not whole pages: use \
                 mmap.mmap(-1, n) or pagewise.alloc(n), whose memory starts on a page"
            ))
        })?;
        // The range must be writable memory of this process, in one mapping.
        let end = region.start + region.len;
        let mapped = pagewise::process::writable(None)
            .map_err(crate::os_error)?
            .iter()
            .any(|m| m.start <= region.start && end <= m.end);
        if !mapped {
            return Err(PyValueError::new_err(format!(
                "{address:#x}, {length} bytes, is not memory of this process"
            )));
        }
        Ok(Held { region })
    }
}

/// Which pages were written since the last collection.
#[pyclass(module = "pagewise._native")]
pub struct Tracker {
    inner: Mutex<DirtyTracker>,
    pid: Option<i32>,
    _held: Option<Held>,
}

#[pymethods]
impl Tracker {
    /// `Tracker(buffer=(address, length))` tracks memory of this process;
    /// `Tracker(pid=...)` another process, from outside.
    #[new]
    #[pyo3(signature = (buffer=None, pid=None, backend="auto"))]
    fn new(
        py: Python<'_>,
        buffer: Option<(u64, u64)>,
        pid: Option<i32>,
        backend: &str,
    ) -> PyResult<Tracker> {
        let kind: BackendKind = backend
            .parse()
            .map_err(|e| PyValueError::new_err(format!("backend {backend}: {e}")))?;
        match (buffer, pid) {
            (Some((address, length)), None) => {
                let held = Held::new(address, length)?;
                let region = held.region;
                let t = py
                    .detach(|| DirtyTracker::new(&[region], kind))
                    .map_err(os_error)?;
                Ok(Tracker {
                    inner: Mutex::new(t),
                    pid: None,
                    _held: Some(held),
                })
            }
            (None, Some(pid)) => {
                let t = py
                    .detach(|| DirtyTracker::for_process(pid, kind))
                    .map_err(os_error)?;
                Ok(Tracker {
                    inner: Mutex::new(t),
                    pid: Some(pid),
                    _held: None,
                })
            }
            _ => Err(PyValueError::new_err("give a buffer or a pid, not both")),
        }
    }

    /// `(ranges, stats)`: the pages written since the last collection, as
    /// `(start, pages)` little-endian `u64` pairs, and the collection's
    /// figures as JSON.
    fn collect<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyBytes>, String)> {
        let pid = self.pid;
        let c = py
            .detach(|| {
                let mut t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(p) = pid {
                    t.sync_process_mappings(Some(p), false)?;
                }
                t.collect()
            })
            .map_err(os_error)?;
        let stats = json(&c.stats)?;
        Ok((
            ranges(py, c.ranges.iter().map(|r| (r.start, r.pages))),
            stats,
        ))
    }

    /// The backend in use (`uffd-wp`, `soft-dirty`, `mprotect`, `hash`).
    #[getter]
    fn backend(&self) -> String {
        let t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        t.backend().name().to_string()
    }

    /// Why the backend asked for was not the one used, if it was not.
    #[getter]
    fn note(&self) -> Option<String> {
        let t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        t.note().map(str::to_string)
    }

    /// The regions tracked, `(start, pages)` pairs as `collect` gives.
    fn regions<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let t = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let ps = pagewise::PAGE_SIZE as u64;
        ranges(py, t.regions().iter().map(|r| (r.start, r.len / ps)))
    }
}
